"""Mooncake EP (mooncake.mooncake_ep_buffer.Buffer) on CPU: dispatch, the
experts, combine, across 2 and 4 real processes over a gloo group and our
Transfer Engine, against the same MoE layer computed in one process.

Tolerances (ep_moe.tolerance): fp32 rtol=atol=1e-5 (only the order of the
weighted sum differs); bf16 and fp8 (combine in bf16) rtol=atol=1.6e-2,
about two bf16 ulps at the outputs' magnitude. fp8 is compared with the
reference on the same fp8 round trip of the inputs, so it checks the
transport of data and scales exactly, not fp8's own error.
"""

from __future__ import annotations

import pytest
import torch

import ep_launch
import ep_moe
from mccluster import free_port

pytestmark = pytest.mark.skipif(ep_launch.env_ok() is not None, reason=str(ep_launch.env_ok()))


def check(cfg, results, steps, dead=()):
    """Every rank's results (None: skip that rank) equal the reference
    layer's output for its tokens, without the experts of ``dead`` ranks."""
    rtol, atol = ep_moe.tolerance(cfg)
    for r, res in enumerate(results):
        if res is None:
            continue
        for s in steps:
            want = ep_moe.reference(cfg, r, s, dead=dead)
            got = res["y"][s]
            assert got.dtype == want.dtype, (r, s)
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"rank {r} step {s}: {m}")


@pytest.mark.parametrize("world,dtype,fp8", [
    (2, "float32", False),  # 2 ranks, 4 experts each
    (2, "bfloat16", False),
    (4, "float32", False),  # 4 ranks, 2 experts each
    (4, "bfloat16", False),
    (4, "bfloat16", True),  # fp8 dispatch with per-128 scales, bf16 combine
])
def test_moe_layer_matches_reference(tmp_path, world, dtype, fp8):
    # Three steps: back-to-back calls alternate the buffer's halves, and
    # the second half's first use must not see stale flags.
    cfg = ep_moe.Config(world=world, dtype=dtype, fp8=fp8)
    results = ep_launch.run(tmp_path, cfg, steps=3)
    check(cfg, results, range(3))
    for res in results:
        assert all(a.tolist() == [1] * world for a in res["active"].values())


def test_over_mooncake_pg(tmp_path):
    # The Buffer's exchange through a mooncake-cpu group (Mooncake PG)
    # instead of gloo: same layer, same result.
    pytest.importorskip("mooncake.pg")
    cfg = ep_moe.Config(world=4, dtype="bfloat16")
    results = ep_launch.run(tmp_path, cfg, steps=2, backend="mooncake-cpu",
                            common={"init": f"tcp://127.0.0.1:{free_port()}"})
    check(cfg, results, range(2))


def test_zero_copy_combine(tmp_path):
    # Experts write into get_next_combine_buffer(handle); combine sends
    # from there without a copy.
    cfg = ep_moe.Config(world=2, dtype="bfloat16")
    results = ep_launch.run(tmp_path, cfg, steps=2, common={"zero_copy": True})
    check(cfg, results, range(2))


def test_negative_control_wrong_routing_is_caught(tmp_path):
    # Rank 1 applies the wrong expert to what it receives: the comparison
    # must fail for the tokens routed there, proving check() can fail.
    cfg = ep_moe.Config(world=2)
    results = ep_launch.run(tmp_path, cfg, steps=1, extra={1: {"bad_routing": True}})
    with pytest.raises(AssertionError):
        check(cfg, results, range(1))
