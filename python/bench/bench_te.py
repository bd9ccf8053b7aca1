"""Python call overhead of the Transfer Engine: batched writes driven from
Python against the same batches driven from Go, measured in one run.

Go:      ``mooncake bench te --no-yardstick --json`` (its initiator engine
         in Go, the target in a child process).
Python:  a target child process of the same binary (``mooncake bench te
         target``) and an initiator in this process through mooncake_go,
         two ways:
           native  TransferEngine.transfer(RequestArray): allocate a batch,
                   submit the 64 requests, wait, free (what Go's loop does);
           compat  mooncake.engine.TransferEngine.batch_transfer_sync_write
                   with Python lists (vLLM's MooncakeConnector call).

The runs are interleaved (Go, native, compat) --repeat times; the medians
are reported, and Python/Go as a ratio (the target is >= 0.90).

    .venv-py/bin/python python/bench/bench_te.py   # 64 x 128 KiB, 3 s x 5 (after scripts/test-python.sh)
    .venv-py/bin/python python/bench/bench_te.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def parse_size(s: str) -> int:
    s = s.strip().lower()
    for suf, mul in (("kib", 1 << 10), ("mib", 1 << 20), ("gib", 1 << 30), ("k", 1 << 10), ("m", 1 << 20)):
        if s.endswith(suf):
            return int(float(s[: -len(suf)]) * mul)
    return int(s)


def go_run(binary: str, block: int, batch: int, duration: float) -> dict:
    out = subprocess.run(
        [binary, "bench", "te", "--transport", "tcp", "--op", "write", "--block-size", str(block),
         "--batch-size", str(batch), "--threads", "1", "--duration", f"{duration}s", "--repeat", "1",
         "--no-yardstick", "--json", "--log-level", "error"],
        check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    batches = r["requests"] / batch
    return {"gb_per_s": r["gb_per_s"], "us_per_batch": r["seconds"] * 1e6 / batches}


class Target:
    """A target engine in a child process of the Go binary: one buffer."""

    def __init__(self, binary: str, size: int):
        self.proc = subprocess.Popen([binary, "bench", "te", "target", "--transport", "tcp", "--buffer-size",
                                      str(size), "--log-level", "error"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()  # the target runs until stdin closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def py_runs(binary: str, block: int, batch: int, duration: float):
    """A generator: each next() measures once native, once compat."""
    import mooncake_go as mg
    from mooncake.engine import TransferEngine as CompatEngine

    size = block * batch
    target = Target(binary, size)
    seg_name, remote = target.info["segment"], target.info["addr"]
    try:
        with mg.TransferEngine(host="127.0.0.1", transport="tcp") as eng:
            with eng.allocate_buffer(size) as buf:
                view = buf.view()
                for i in range(0, size, 4096):  # fault the pages in, as Go's side does
                    view[i] = (i >> 12) & 0xFF | 1
                seg = eng.open_segment(seg_name)
                locals_ = [buf.addr + i * block for i in range(batch)]
                remotes = [remote + i * block for i in range(batch)]
                lengths = [block] * batch
                reqs = mg.RequestArray.of(mg.Op.WRITE, seg, locals_, remotes, lengths)

                compat = CompatEngine()
                assert compat.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
                csrc = compat.allocate_managed_buffer(size)
                assert csrc
                clocals = [csrc + i * block for i in range(batch)]

                def native_once():
                    eng.transfer(reqs)

                def compat_once():
                    rc = compat.batch_transfer_sync_write(seg_name, clocals, remotes, lengths)
                    if rc != 0:
                        raise RuntimeError(f"batch_transfer_sync_write returned {rc}")

                def measure(fn):
                    for _ in range(20):  # warm-up: connections, lanes
                        fn()
                    n = 0
                    t0 = time.perf_counter()
                    end = t0 + duration
                    while time.perf_counter() < end:
                        fn()
                        n += 1
                    dt = time.perf_counter() - t0
                    return {"gb_per_s": n * size / dt / 1e9, "us_per_batch": dt * 1e6 / n}

                try:
                    while True:
                        yield measure(native_once), measure(compat_once)
                finally:
                    compat.close()
    finally:
        target.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-size", default="128KiB")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bin", default=os.environ.get("MOONCAKE_BIN", str(ROOT / "bin" / "mooncake")))
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    block = parse_size(a.block_size)

    runs = {"go": [], "python-native": [], "python-compat": []}
    py = py_runs(a.bin, block, a.batch_size, a.duration)
    for i in range(a.repeat):
        runs["go"].append(go_run(a.bin, block, a.batch_size, a.duration))
        native, compat = next(py)
        runs["python-native"].append(native)
        runs["python-compat"].append(compat)
        print(f"run {i + 1}/{a.repeat}: go {runs['go'][-1]['gb_per_s']:.3f} GB/s, "
              f"python native {native['gb_per_s']:.3f}, compat {compat['gb_per_s']:.3f}", file=sys.stderr)
    py.close()

    med = {k: {m: statistics.median(r[m] for r in v) for m in ("gb_per_s", "us_per_batch")} for k, v in runs.items()}
    go = med["go"]["gb_per_s"]
    print(f"write, tcp, {a.batch_size} x {block >> 10} KiB per batch, 1 thread, "
          f"{a.repeat} x {a.duration:g} s, medians")
    print(f"{'initiator':<16}{'GB/s':>10}{'us/batch':>12}{'vs Go':>9}")
    for k in runs:
        g = med[k]["gb_per_s"]
        print(f"{k:<16}{g:>10.3f}{med[k]['us_per_batch']:>12.1f}{g / go:>9.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"block_size": block, "batch_size": a.batch_size, "duration_s": a.duration,
                       "repeat": a.repeat, "median": med, "runs": runs,
                       "ratio_native": med["python-native"]["gb_per_s"] / go,
                       "ratio_compat": med["python-compat"]["gb_per_s"] / go}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
