"""Throughput of LMCache's remote tier on a real `mooncake up`, through
LMCache's own RemoteBackend (CreateStorageBackends), same run, same chunk
geometry and bytes:

- ours: the mooncake_go plugin (connectors/lmcache, remote_storage_plugins);
- builtin-zc: LMCache's built-in `mooncakestore://` connector on our compat
  module, save_chunk_meta false (batch_put_from / batch_get_into);
- builtin: the same connector as LMCache ships it, save_chunk_meta true
  (its default: put_parts per chunk, batch_get_buffer).

Per repeat and connector: a batch of --chunks fresh chunks is put
(batched_submit_put_task, until LMCache reports every write done), looked
up (batched_async_contains, LMCache's prefix lookup) and read back
(batched_get_blocking), and the bytes are checked. The connectors take
turns within each repeat, so they share the machine's noise; figures are
medians over --repeat. Run with:

    bash e2e/py.sh lmcache e2e/lmcache/bench_remote.py

Results go to --out as JSON and a table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "python" / "tests")]

import torch  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend import CreateStorageBackends  # noqa: E402
from lmcache.v1.token_database import ChunkedTokenDatabase  # noqa: E402
from mccluster import start_cluster  # noqa: E402
from mooncake_go import Store  # noqa: E402

WAIT = 120


def metadata(args) -> LMCacheMetadata:
    shape = (args.layers, 2, args.chunk_tokens, args.heads, args.head_size)
    return LMCacheMetadata(model_name="bench", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                           kv_dtype=torch.bfloat16, kv_shape=shape, chunk_size=args.chunk_tokens)


def chunk_bytes(args) -> int:
    return args.layers * 2 * args.chunk_tokens * args.heads * args.head_size * 2


def make_config(args, name: str, master: str) -> LMCacheEngineConfig:
    pool_gb = 2.5 * args.chunks * chunk_bytes(args) / (1 << 30)
    base = dict(chunk_size=args.chunk_tokens, local_cpu=True, max_local_cpu_size=pool_gb, remote_serde="naive",
                blocking_timeout_secs=WAIT)
    if name.startswith("ours"):
        p = "remote_storage_plugin.mooncake_go."
        extra = {p + "module_path": "mooncake_go.connectors.lmcache", p + "class_name": "MooncakeGoAdapter",
                 p + "master": master, p + "local_hostname": "127.0.0.1", p + "protocol": "tcp", p + "timeout": WAIT}
        if name[4:]:  # ours<N>: N streams
            extra[p + "streams"] = int(name[4:])
        return LMCacheEngineConfig.from_defaults(remote_storage_plugins=["mooncake_go"], extra_config=extra, **base)
    # The built-in connector with the same placement as ours: no segment of
    # its own, so both write to the node of `mooncake up`.
    extra = {"save_chunk_meta": name == "builtin", "transfer_timeout": WAIT, "mooncake_local_hostname": "127.0.0.1",
             "mooncake_metadata_server": "P2PHANDSHAKE", "mooncake_master_server_address": master,
             "mooncake_global_segment_size": "0", "mooncake_local_buffer_size": str(64 << 20),
             "mooncake_protocol": "tcp"}
    return LMCacheEngineConfig.from_defaults(remote_url="mooncakestore://127.0.0.1:50051/", extra_config=extra, **base)


class Side:
    """One connector's LMCache backends."""

    def __init__(self, args, name: str, master: str, loop, cleaner):
        self.args, self.name, self.cleaner = args, name, cleaner
        self.cfg = make_config(args, name, master)
        self.md = metadata(args)
        made = CreateStorageBackends(self.cfg, self.md, loop)
        self.cpu = made["LocalCPUBackend"]
        self.remote = next(b for k, b in made.items() if k.startswith("RemoteBackend"))
        if self.remote.connection is None:
            raise RuntimeError(f"{name}: LMCache could not create its connector")
        self.db = ChunkedTokenDatabase(self.cfg, self.md)
        # Fault the whole pool in once, as a pinned (page-locked) pool is in
        # a real deployment: otherwise a connector pays first-touch page
        # faults on whichever part of the pool its allocations land.
        buf = getattr(self.cpu.memory_allocator, "buffer", None)
        if buf is not None:
            buf.fill_(0)

    def chunks(self, seed: int):
        """Fresh keys (tokens of their own) and memory objects filled with
        the bytes of seed: every connector moves the same bytes."""
        rng = random.Random(f"{self.name}-{seed}")
        tokens = [rng.randrange(1, 32000) for _ in range(self.args.chunks * self.args.chunk_tokens)]
        keys = [k for _, _, k in self.db.process_tokens(tokens)]
        objs, want = [], []
        for i in range(len(keys)):
            o = self.cpu.allocate(self.md.get_shapes(), self.md.get_dtypes())
            data = random.Random(seed * 1000 + i).randbytes(self.args.sample)
            ctypes.memmove(o.data_ptr, data, len(data))
            objs.append(o)
            want.append(data)
        return keys, objs, want

    def round(self, seed: int) -> dict:
        keys, objs, want = self.chunks(seed)
        done = threading.Semaphore(0)
        t0 = time.perf_counter()
        self.remote.batched_submit_put_task(keys, objs, on_complete_callback=lambda k: done.release())
        for _ in keys:
            if not done.acquire(timeout=WAIT):
                raise RuntimeError(f"{self.name}: put did not complete")
        t1 = time.perf_counter()
        for o in objs:
            o.ref_count_down()
        fut = asyncio.run_coroutine_threadsafe(self.remote.batched_async_contains("bench", keys), self.remote.loop)
        hits = fut.result(WAIT)
        t2 = time.perf_counter()
        got = self.remote.batched_get_blocking(keys)
        t3 = time.perf_counter()
        bad = 0
        for g, w in zip(got, want):
            if g is None or bytes(g.byte_array[:len(w)]) != w:
                bad += 1
            if g is not None:
                g.ref_count_down()
        if hits != len(keys) or bad or self.remote.put_failed_count:
            raise RuntimeError(f"{self.name}: {hits}/{len(keys)} found, {bad} chunks wrong, "
                               f"{self.remote.put_failed_count} puts failed")
        # Untimed: the round's chunks leave the pool, so the node's segment
        # need only hold one round.
        self.cleaner.batch_remove([k.to_string() for k in keys], force=True)
        total = len(keys) * chunk_bytes(self.args)
        return {"put_GBps": total / (t1 - t0) / 1e9, "contains_ms": (t2 - t1) * 1e3,
                "get_GBps": total / (t3 - t2) / 1e9}

    def close(self):
        self.remote.close()
        self.cpu.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=32, help="chunks per batch")
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sample", type=int, default=4096, help="leading bytes of each chunk filled and checked")
    ap.add_argument("--sides", default="ours,builtin-zc,builtin")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "lmcache-remote.json")
    args = ap.parse_args()
    os.environ.pop("MOONCAKE_CONFIG_PATH", None)  # the built-in connector would read it first
    args.sample = min(args.sample, chunk_bytes(args))
    names = args.sides.split(",")

    seg = max(1 << 30, 4 * len(names) * args.chunks * chunk_bytes(args))
    bin_ = Path(os.environ.get("MOONCAKE_BIN", ROOT / "bin" / "mooncake"))
    cluster = start_cluster(bin_, "--no-ha", "--nodes", "1", "--global_segment_size", str(seg))
    loop = asyncio.new_event_loop()
    lt = threading.Thread(target=loop.run_forever, daemon=True)
    lt.start()
    sides = []
    cleaner = None
    try:
        cleaner = Store(cluster.master, segment_size=-1, local_hostname="127.0.0.1")
        sides = [Side(args, n, cluster.master, loop, cleaner) for n in names]
        for s in sides:  # warm-up: connections, first allocations
            s.round(10_000)
        rows = {s.name: [] for s in sides}
        for r in range(args.repeat):
            order = sides if r % 2 == 0 else sides[::-1]
            for s in order:
                rows[s.name].append(s.round(r))
    finally:
        for s in sides:
            s.close()
        if cleaner is not None:
            cleaner.close()
        loop.call_soon_threadsafe(loop.stop)
        lt.join(10)
        cluster.stop()

    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in rows.items()}
    result = {"chunk_bytes": chunk_bytes(args), "chunks": args.chunks, "repeat": args.repeat,
              "medians": med, "runs": rows, "argv": sys.argv[1:]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{args.chunks} chunks of {chunk_bytes(args) / (1 << 20):.2f} MiB per batch, medians of {args.repeat}")
    print(f"{'connector':<12} {'put GB/s':>9} {'get GB/s':>9} {'contains ms':>12}")
    for n, m in med.items():
        print(f"{n:<12} {m['put_GBps']:>9.3f} {m['get_GBps']:>9.3f} {m['contains_ms']:>12.2f}")
    if "ours" in med:
        for n, m in med.items():
            if n != "ours":
                o = med["ours"]
                print(f"ours / {n}: put {o['put_GBps'] / m['put_GBps']:.2f}x, get {o['get_GBps'] / m['get_GBps']:.2f}x, "
                      f"contains {m['contains_ms'] / o['contains_ms']:.2f}x")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
