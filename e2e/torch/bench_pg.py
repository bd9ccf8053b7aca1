"""Mooncake PG against gloo: all_reduce and all_gather bus bandwidth, 4 local
ranks, 1 KiB to 256 MiB, both backends in the same processes and the same
run, alternating repeat by repeat; medians of the repeats.

    bash e2e/py.sh torch e2e/torch/bench_pg.py [--ranks 4] [--min 1KiB] [--max 256MiB] [--step 4] [--repeats 5]

Sizes are nccl-tests': the all_reduce tensor, the all_gather output. Bus
bandwidth = size / time x 2(n-1)/n (all_reduce) or (n-1)/n (all_gather);
time per op = the slowest rank's mean over a repeat's iterations. Writes
the rows as JSON (--out, default build/bench/pg.json) and, when Go is on
PATH, Parquet and PNG beside it with e2e/torch/benchplot."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def parse_size(s: str) -> int:
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    for u, m in units.items():
        if s.upper().endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def rank_main(rank: int, world: int, port: int, sizes, repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from mooncake import pg  # noqa: F401 - registers mooncake-cpu

    dist.init_process_group("mooncake-cpu", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    gloo = dist.new_group(backend="gloo")
    groups = {"mooncake-cpu": None, "gloo": gloo}
    rows = []
    for size in sizes:
        iters = max(1, min(50, (16 << 20) // size))
        for op in ("all_reduce", "all_gather"):
            n = size // 4 if op == "all_reduce" else size // 4 // world
            x = torch.ones(max(n, 1))
            y = torch.empty(max(n, 1) * world) if op == "all_gather" else None
            times = {b: [] for b in groups}
            for rep in range(repeats + 1):  # the first repeat warms up
                for b, g in groups.items():
                    dist.barrier(group=gloo)
                    t = time.perf_counter()
                    for _ in range(iters):
                        if op == "all_reduce":
                            dist.all_reduce(x, group=g)
                        else:
                            dist.all_gather_into_tensor(y, x, group=g)
                    dt = torch.tensor([(time.perf_counter() - t) / iters], dtype=torch.float64)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
                    if rep:
                        times[b].append(dt.item())
                    if op == "all_reduce":
                        x.fill_(1)
            factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
            med = {b: statistics.median(ts) for b, ts in times.items()}
            for b, ts in times.items():
                rows.append({"op": op, "backend": b, "bytes": size, "ranks": world, "repeats": repeats,
                             "iters": iters, "median_s": med[b], "min_s": min(ts), "max_s": max(ts),
                             "busbw_gbps": size / med[b] * factor / 1e9})
            if rank == 0:
                print(f"{op:10} {size:>10} B  mooncake-cpu {rows[-2]['busbw_gbps']:7.3f} GB/s  "
                      f"gloo {rows[-1]['busbw_gbps']:7.3f} GB/s  ratio {med['gloo'] / med['mooncake-cpu']:5.2f}",
                      flush=True)
            del x, y
    if rank == 0:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(rows, indent=1))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--min", default="1KiB")
    ap.add_argument("--max", default="256MiB")
    ap.add_argument("--step", type=int, default=4, help="each size is the previous one times this")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "pg.json"))
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = []
    s = parse_size(a.min)
    while s <= parse_size(a.max):
        sizes.append(s)
        s *= max(2, a.step)
    if a.rank is not None:
        rank_main(a.rank, a.ranks, a.port, sizes, a.repeats, a.out)
        return
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--ranks",
                               str(a.ranks), "--min", a.min, "--max", a.max, "--step", str(a.step), "--repeats", str(a.repeats),
                               "--out", a.out], env=env) for r in range(a.ranks)]
    try:
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        sys.exit(f"bench_pg: ranks exited {codes}")
    go = shutil.which("go")
    if go:
        base = str(Path(a.out).with_suffix(""))
        subprocess.run([go, "run", "./e2e/torch/benchplot", "-in", a.out, "-out", base], cwd=ROOT, check=True)
        print(f"bench_pg: {a.out}, {base}.parquet, {base}.png")
    else:
        print(f"bench_pg: {a.out} (no go on PATH: no Parquet/PNG)")


if __name__ == "__main__":
    main()
