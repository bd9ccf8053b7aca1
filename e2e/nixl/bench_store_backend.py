"""Throughput of NIXL's object path on MOONCAKE_STORE (connectors/nixl)
against NIXL's own POSIX file backend, on the same data in the same run.

One NIXL agent per backend, in one process: N objects of SIZE bytes are
written from one DRAM buffer in one transfer (WRITE: store upserts / file
writes), REPEATS times, then read back into another buffer in one transfer
(READ), REPEATS times, the backends taking turns; every read is checked
byte for byte (outside the timing). The first write, which creates the
objects, is reported apart, and WARMUP more rounds of both are not timed
(the first upserts after the objects were created measured 3-7x the
steady state: space of the store node this process maps for the first
time). MOONCAKE_STORE runs twice: as configured by default (a CRC-32C of
every object written) and with checksum "false" (NIXL's ranged reads do
not check it; see connectors/nixl/README.md). MOONCAKE_STORE talks to a `mooncake up` started here
(one storage node); its agent adds no memory to the pool unless --local, so
every byte crosses to the storage node's process. POSIX writes files in a
temporary folder (the page cache; no fsync). A numpy copy of the same bytes
is the yardstick. Prints medians and one JSON line.

Run: bash e2e/py.sh nixl e2e/nixl/bench_store_backend.py [--objects 64 --size 1MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))
sys.path.insert(0, str(HERE))


def plugin_env() -> dict | None:
    """The environment this script needs before its first NIXL agent: one
    plugin folder with our plugin and the wheel's POSIX (symbolic links),
    and the wheel's library folders on LD_LIBRARY_PATH, which the POSIX
    plugin finds through $ORIGIN of its own folder otherwise. None when the
    environment is already set (after the re-exec)."""
    if os.environ.get("MC_NIXL_BENCH_READY") == "1":
        return None
    import importlib.metadata as md

    from store_agent import build_store_plugin

    ours = build_store_plugin() / "libplugin_MOONCAKE_STORE.so"
    libnixl = next(f.locate().resolve() for f in md.files("nixl-cu12") if f.name == "libnixl.so")
    posix = libnixl.parent / "plugins" / "libplugin_POSIX.so"
    plugins = Path(tempfile.mkdtemp(prefix="nixl-bench-plugins-"))
    for p in (ours, posix):
        (plugins / p.name).symlink_to(p)
    env = dict(os.environ, NIXL_PLUGIN_DIR=str(plugins), MC_NIXL_BENCH_READY="1")
    libs = [str(libnixl.parent), str(libnixl.parent.parent / "nixl_cu12.libs")]
    env["LD_LIBRARY_PATH"] = ":".join(libs + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p])
    return env


def parse_size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(s[: -len(u)]) * m
    return int(s)


def timed(agent, handle) -> float:
    t = time.perf_counter()
    state = agent.run(handle)
    dt = time.perf_counter() - t
    assert state == "DONE", state
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=64)
    ap.add_argument("--size", type=parse_size, default=1 << 20, help="bytes per object (KiB/MiB suffix)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=3, help="untimed write and read rounds after the first write")
    ap.add_argument("--local", action="store_true", help="the store agent adds its own 512 MiB segment to the pool")
    args = ap.parse_args()

    env = plugin_env()
    if env is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    import numpy as np

    from mccluster import start_cluster
    from store_agent import StoreAgent, check_bytes

    n, size = args.objects, args.size
    total = n * size
    src = np.random.default_rng(1).integers(0, 256, total, dtype=np.uint8)
    pieces = [(src.ctypes.data + i * size, size) for i in range(n)]

    bin_ = Path(os.environ.get("MOONCAKE_BIN", ROOT / "bin" / "mooncake"))
    pool = max(1 << 30, 8 * total)
    cluster = start_cluster(bin_, "--no-ha", "--nodes", "1", "--global_segment_size", f"{pool >> 20}MiB")
    files = tempfile.TemporaryDirectory(prefix="nixl-bench-posix-")
    fds = []
    agents = {}
    handles = {}
    try:
        params = {"master_server_address": cluster.master, "global_segment_size": "512MiB" if args.local else "-1",
                  "local_buffer_size": "16MiB"}
        store = StoreAgent("bench-store", params=params)
        nocrc = StoreAgent("bench-store-nocrc", params=dict(params, checksum="false"))
        fds = [os.open(f"{files.name}/obj{i}", os.O_RDWR | os.O_CREAT, 0o600) for i in range(n)]
        posix = StoreAgent("bench-posix", backend="POSIX", remote_type="FILE")
        agents = {"MOONCAKE_STORE": (store, [f"bench/obj{i}" for i in range(n)]),
                  "MOONCAKE_STORE/nocrc": (nocrc, [f"bench/nocrc/obj{i}" for i in range(n)]),
                  "POSIX": (posix, [str(fd) for fd in fds])}

        dsts = {}
        cold = {}
        for name, (agent, objs) in agents.items():
            dst = np.zeros_like(src)
            dsts[name] = dst
            agent.register_dram(src)
            agent.register_dram(dst)
            devs = agent.register_objects(objs, [size] * n)
            back = [(dst.ctypes.data + i * size, size) for i in range(n)]
            handles[name] = (agent.xfer("WRITE", pieces, [(0, d) for d in devs]),
                             agent.xfer("READ", back, [(0, d) for d in devs]))
            # The first write creates the objects (files) on space this
            # process has not touched yet: reported apart, as "cold".
            cold[name] = timed(agent, handles[name][0])

        # Writes first, then reads: an upsert of an object read within its
        # lease (a few seconds) cannot reuse its space, and would measure
        # fresh space every round instead of the steady state.
        times = {name: {"write": [], "read": []} for name in agents}
        times["memcpy"] = {"copy": []}
        scratch = np.empty_like(src)
        for op in ("write", "read"):
            for _ in range(args.warmup):  # untimed (module doc)
                for name, (agent, _) in agents.items():
                    timed(agent, handles[name][0 if op == "write" else 1])
            for _ in range(args.repeats):
                for name, (agent, _) in agents.items():
                    w, r = handles[name]
                    if op == "read":
                        dsts[name][:] = 0
                    times[name][op].append(timed(agent, w if op == "write" else r))
                    if op == "read":
                        check_bytes(dsts[name], src, f"{name} read")
                if op == "read":
                    t = time.perf_counter()
                    np.copyto(scratch, src)
                    times["memcpy"]["copy"].append(time.perf_counter() - t)

        result = {"objects": n, "object_bytes": size, "repeats": args.repeats, "warmup": args.warmup,
                  "store_segment": "local" if args.local else "storage node", "median_s": {}, "GBps": {}}
        print(f"{n} objects x {size} B = {total / (1 << 20):.0f} MiB per transfer, "
              f"medians of {args.repeats} (store segment: {result['store_segment']})")
        for name, dt in cold.items():
            result["median_s"][f"{name}/cold_write"] = round(dt, 6)
            print(f"  {name:20s} first write (cold) {dt * 1e3:8.2f} ms")
        for name, ops in times.items():
            for op, ts in ops.items():
                med = statistics.median(ts)
                result["median_s"][f"{name}/{op}"] = round(med, 6)
                result["GBps"][f"{name}/{op}"] = round(total / med / 1e9, 3)
                print(f"  {name:20s} {op:5s} {med * 1e3:8.2f} ms  {total / med / 1e9:6.2f} GB/s")
        for name, tag in (("MOONCAKE_STORE", "store"), ("MOONCAKE_STORE/nocrc", "store_nocrc")):
            for op in ("write", "read"):
                ratio = statistics.median(times["POSIX"][op]) / statistics.median(times[name][op])
                result[f"{tag}_vs_posix_{op}"] = round(ratio, 2)
                print(f"  {name} {op} is {ratio:.2f}x POSIX's throughput")
        print(json.dumps(result))
    finally:
        # Transfer handles keep their agent alive: release them first, so
        # the agents (and the store client) end before the master stops.
        for hs in handles.values():
            for h in hs:
                h.release()
        handles.clear()
        for agent, _ in agents.values():
            agent.close()
        for fd in fds:
            os.close(fd)
        files.cleanup()
        cluster.stop()
        # plugin_env's folder of links, made for this run only.
        shutil.rmtree(os.environ["NIXL_PLUGIN_DIR"], ignore_errors=True)


if __name__ == "__main__":
    main()
