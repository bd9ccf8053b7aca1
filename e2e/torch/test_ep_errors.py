"""Mooncake EP misuse gives clear errors (one process, a one-rank gloo
group; the checks run before anything is sent)."""

from __future__ import annotations

import pytest
import torch

import ep_launch

pytestmark = pytest.mark.skipif(ep_launch.env_ok() is not None, reason=str(ep_launch.env_ok()))

T, H, E = 8, 128, 4


@pytest.fixture(scope="module")
def buf(tmp_path_factory):
    import torch.distributed as dist
    from mooncake.mooncake_ep_buffer import Buffer

    store = tmp_path_factory.mktemp("ep") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    b = Buffer(dist.group.WORLD, Buffer.get_ep_buffer_size_hint(T, H, 1, E))
    yield b
    b.destroy()
    dist.destroy_process_group()


def ones():
    return torch.ones(1, dtype=torch.int32)


def test_size_hint_rejects_indivisible_experts():
    from mooncake.mooncake_ep_buffer import Buffer

    with pytest.raises(ValueError, match=r"num_experts \(6\) must be a positive multiple of the number of ranks \(4\)"):
        Buffer.get_ep_buffer_size_hint(T, H, 4, 6)


def test_size_hint_grows_with_every_argument():
    from mooncake.mooncake_ep_buffer import Buffer

    base = Buffer.get_ep_buffer_size_hint(T, H, 2, E)
    # Four data regions of E*T rows of hidden*4 bytes, plus staging.
    assert base >= 5 * E * T * H * 4
    for args in [(2 * T, H, 2, E), (T, 2 * H, 2, E), (T, H, 2, 2 * E)]:
        assert Buffer.get_ep_buffer_size_hint(*args) > base


def test_round_trip_on_one_rank(buf):
    # Sanity of the fixture: identity experts give back sum(weights) * x.
    x = torch.randn(5, H)
    idx = torch.tensor([[0, 1], [2, -1], [-1, -1], [3, 3], [1, 0]])
    w = torch.rand(5, 2)
    rx, rc, h, ev, hook = buf.dispatch(x, idx, ones(), T, E, 1_000_000, use_fp8=False)
    assert hook is None and rc.tolist() == [2, 2, 1, 2]
    ev.current_stream_wait()
    y, _, _ = buf.combine(rx, idx, w, ones(), 1_000_000, h)
    want = x * (w * (idx >= 0)).sum(1, keepdim=True)
    torch.testing.assert_close(y, want)


def test_recv_hook_defers_the_receive(buf):
    x = torch.randn(3, H)
    idx = torch.tensor([[0], [1], [1]])
    rx, rc, h, _, hook = buf.dispatch(x, idx, ones(), T, E, -1, use_fp8=False, return_recv_hook=True)
    assert rc.tolist() == [0, 0, 0, 0]
    with pytest.raises(RuntimeError, match="before the dispatch's receive hook"):
        buf.combine(rx, idx, torch.ones(3, 1), ones(), -1, h)
    hook()
    assert rc.tolist() == [1, 2, 0, 0]
    y, _, hook2 = buf.combine(rx, idx, torch.ones(3, 1), ones(), -1, h, return_recv_hook=True)
    hook2()
    torch.testing.assert_close(y, x)


@pytest.mark.parametrize("kwargs,exc,match", [
    # x: 1-D, wrong dtype, too many tokens
    (dict(x=torch.randn(H)), ValueError, r"x must be \[num_tokens, hidden\]"),
    (dict(x=torch.randn(2, H, dtype=torch.float16)), TypeError, "x must be bfloat16 or float32"),
    (dict(x=torch.randn(T + 1, H), topk_idx=torch.zeros(T + 1, 1, dtype=torch.int64)), ValueError,
     "more than num_max_dispatch_tokens_per_rank=8"),
    # topk_idx: wrong rows, float, out of range
    (dict(topk_idx=torch.zeros(3, 2, dtype=torch.int64)), ValueError, r"topk_idx must be a \[num_tokens=2, top_k\]"),
    (dict(topk_idx=torch.zeros(2, 2)), TypeError, "topk_idx must be an integer tensor"),
    (dict(topk_idx=torch.tensor([[0, 4], [1, 2]])), ValueError, r"must be -1 or in \[0, 4\)"),
    (dict(topk_idx=torch.tensor([[0, -2], [1, 2]])), ValueError, r"must be -1 or in \[0, 4\)"),
    # active_ranks: int64, wrong length
    (dict(active_ranks=torch.ones(1, dtype=torch.int64)), ValueError, "active_ranks must be a CPU int32 tensor of shape"),
    (dict(active_ranks=torch.ones(2, dtype=torch.int32)), ValueError, r"of shape \[1\]"),
    # sizes the buffer cannot hold; experts that are not positive
    (dict(num_max_dispatch_tokens_per_rank=4 * T), ValueError, "EP buffer too small"),
    (dict(num_experts=0), ValueError, "num_experts"),
    # fp8 needs hidden in groups of 128
    (dict(x=torch.randn(2, 64), use_fp8=True), ValueError, "hidden divisible by 128"),
])
def test_dispatch_misuse(buf, kwargs, exc, match):
    args = dict(x=torch.randn(2, H), topk_idx=torch.tensor([[0, 1], [2, -1]]), active_ranks=ones(),
                num_max_dispatch_tokens_per_rank=T, num_experts=E, timeout_us=-1, use_fp8=False)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        buf.dispatch(**args)


def test_combine_misuse(buf):
    x = torch.randn(2, H)
    idx = torch.tensor([[0, 1], [2, -1]])
    rx, _, h, _, _ = buf.dispatch(x, idx, ones(), T, E, -1, use_fp8=False)
    w = torch.ones(2, 2)
    with pytest.raises(ValueError, match=r"x must be \[4, 8, 128\]"):
        buf.combine(rx[:, :4], idx, w, ones(), -1, h)
    with pytest.raises(TypeError, match="x must be bfloat16 or float32"):
        buf.combine(rx.half(), idx, w, ones(), -1, h)
    with pytest.raises(ValueError, match="topk_weights must be a float"):
        buf.combine(rx, idx, w[:, :1], ones(), -1, h)
    with pytest.raises(ValueError, match="zero_copy needs x to be the tensor get_next_combine_buffer returned"):
        buf.combine(rx, idx, w, ones(), -1, h, zero_copy=True)
    with pytest.raises(ValueError, match="handle must come from this buffer's dispatch"):
        buf.combine(rx, idx, w, ones(), -1, ("not", "a", "handle"))


def test_fp8_data_and_scales(buf):
    # use_fp8 (the default) returns (float8_e4m3fn data, float32 scales
    # [.., hidden/128]) whose product is x within fp8's precision.
    from mooncake.mooncake_ep_buffer import per_token_cast_back

    x = (torch.randn(4, H, generator=torch.Generator().manual_seed(7)) * 10).to(torch.bfloat16)
    idx = torch.tensor([[0], [0], [3], [-1]])
    (data, scales), rc, _, _, _ = buf.dispatch(x, idx, ones(), T, E, -1)
    assert data.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32
    assert tuple(scales.shape) == (E, T, H // 128)
    back = per_token_cast_back(data, scales)
    # e4m3: 3 mantissa bits (relative error <= 2^-4) down to its
    # subnormals, spaced 2^-9 * scale (scale = amax / 448, ~0.1 here).
    tol = dict(rtol=2 ** -4, atol=2 ** -10 * float(scales.max()))
    torch.testing.assert_close(back[0, :2], x[:2].float(), **tol)
    torch.testing.assert_close(back[3, :1], x[2:3].float(), **tol)


def test_update_ep_member_invalidates_handles(buf):
    x = torch.randn(1, H)
    idx = torch.tensor([[0]])
    rx, _, h, _, _ = buf.dispatch(x, idx, ones(), T, E, -1, use_fp8=False)
    buf.update_ep_member()
    with pytest.raises(ValueError, match="predates update_ep_member"):
        buf.combine(rx, idx, torch.ones(1, 1), ones(), -1, h)


def test_fp8_without_float8_dtypes(buf, monkeypatch):
    # A torch without float8 dtypes: use_fp8=True says so and how to do without.
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(RuntimeError, match="needs torch.float8_e4m3fn.*pass use_fp8=False"):
        buf.dispatch(torch.randn(2, H), torch.tensor([[0], [1]]), ones(), T, E, -1, use_fp8=True)
