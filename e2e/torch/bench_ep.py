"""Mooncake EP dispatch + combine on CPU against the same exchange written
with torch.distributed.all_to_all_single on gloo, measured in the same run.

    python e2e/torch/bench_ep.py [--world 2] [--tokens 128] [--hidden 2048]
        [--experts 8] [--topk 2] [--dtype bfloat16] [--iters 30]

Starts --world local processes (one gloo group). Each iteration moves
every (token, choice) pair to the rank owning the expert and the expert's
rows back, then sums them weighted: with Mooncake EP, Buffer.dispatch and
Buffer.combine (experts = identity); with gloo, the same pairs sorted by
destination, their counts swapped by all_to_all_single, the rows by
all_to_all_single, and back. The two alternate iteration by iteration (a
shared host's load hits both alike), each after an untimed barrier;
rank 0 reports the median latency of an iteration and the payload moved
per second (both directions, all ranks' rows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128, help="tokens per rank per step (and the per-rank maximum)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--init", default="", help=argparse.SUPPRESS)
    return p.parse_args()


def worker(a):
    import torch
    import torch.distributed as dist

    from mooncake.mooncake_ep_buffer import Buffer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world)
    dtype = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(a.rank)
    x = torch.randn(a.tokens, a.hidden, generator=g).to(dtype)
    idx = torch.stack([torch.randperm(a.experts, generator=g)[: a.topk] for _ in range(a.tokens)])
    w = torch.rand(a.tokens, a.topk, generator=g)
    lx = a.experts // a.world
    buf = Buffer(None, Buffer.get_ep_buffer_size_hint(a.tokens, a.hidden, a.world, a.experts))
    active = torch.ones(a.world, dtype=torch.int32)

    def mooncake_ep():
        rx, _, h, _, _ = buf.dispatch(x, idx, active, a.tokens, a.experts, 10_000_000, use_fp8=False)
        y, _, _ = buf.combine(rx, idx, w, active, 10_000_000, h)
        return y

    # The gloo yardstick: the same pairs, the same rows, the same sum.
    tok = torch.arange(a.tokens)[:, None].expand(-1, a.topk).reshape(-1)
    flat = idx.reshape(-1)
    order = torch.argsort(flat // lx, stable=True)
    send_tok, send_w = tok[order], w.reshape(-1)[order]
    send_counts = torch.bincount(flat // lx, minlength=a.world)

    def gloo_a2a():
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        rows = x.index_select(0, send_tok)
        got = torch.empty(sum(rc), a.hidden, dtype=dtype)
        dist.all_to_all_single(got, rows, rc, sc)
        back = torch.empty_like(rows)
        dist.all_to_all_single(back, got, sc, rc)  # experts: identity
        y = torch.zeros(a.tokens, a.hidden, dtype=torch.float32)
        y.index_add_(0, send_tok, back.to(torch.float32) * send_w[:, None])
        return y.to(dtype)

    # Both must agree before either is timed.
    torch.testing.assert_close(mooncake_ep(), gloo_a2a(), rtol=1e-2, atol=1e-2)
    # Interleaved, so both see the same load on a shared host.
    fns = (("mooncake_ep", mooncake_ep), ("gloo_all_to_all_single", gloo_a2a))
    times = {name: [] for name, _ in fns}
    for i in range(a.warmup + a.iters):
        for name, fn in fns:
            dist.barrier()
            t = time.perf_counter()
            fn()
            if i >= a.warmup:
                times[name].append(time.perf_counter() - t)
    results = {name: statistics.median(ts) for name, ts in times.items()}
    if a.rank == 0:
        elem = torch.empty((), dtype=dtype).element_size()
        payload = 2 * a.world * a.tokens * a.topk * a.hidden * elem  # both directions, all ranks
        out = {"config": {k: getattr(a, k) for k in ("world", "tokens", "hidden", "experts", "topk", "dtype", "iters")}}
        for name, med in results.items():
            out[name] = {"median_ms": round(med * 1e3, 3), "GB_per_s": round(payload / med / 1e9, 3),
                         "tokens_per_s": round(a.world * a.tokens / med)}
        out["speedup"] = round(results["gloo_all_to_all_single"] / results["mooncake_ep"], 2)
        print(json.dumps(out))
    dist.barrier()
    buf.destroy()
    dist.destroy_process_group()


def main():
    a = parse()
    if a.rank >= 0:
        worker(a)
        return
    if a.experts % a.world:
        sys.exit(f"--experts {a.experts} must be a multiple of --world {a.world}")
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{os.path.join(d, 'store')}"
        procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--rank", str(r), "--init", init])
                 for r in range(a.world)]
        rc = [p.wait() for p in procs]
    if any(rc):
        sys.exit(f"a rank failed: exit codes {rc}")


if __name__ == "__main__":
    main()
