"""LMCache's own storage backends on a real `mooncake up`: what its engine
builds with CreateStorageBackends for `remote_url: mooncakestore://...`
(a LocalCPUBackend, whose pinned pool the connector registers with the
store, and a RemoteBackend over LMCache's MooncakestoreConnector).

Every case runs in both of the connector's modes and with the Mooncake
settings given both ways LMCache reads them:
- save_chunk_meta true ("meta"): a chunk is stored as LMCache's RemoteMetadata
  header plus its KV bytes (put_parts) and read back with batch_get_buffer;
- save_chunk_meta false ("zero-copy"): KV bytes only, written from and read
  into the registered pool (put_from, batch_put_from, batch_get_into);
- a JSON file named by MOONCAKE_CONFIG_PATH ("file"), or extra_config's
  mooncake_* keys ("extra").
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from lmcharness import (CHUNK, chunk_keys, engine_config, fill, metadata, mismatches, mooncake_settings,
                      random_tokens)
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend import CreateStorageBackends
from lmcache.v1.storage_backend.connector.mooncakestore_connector import MooncakestoreConnector

from mooncake.store import MooncakeDistributedStore

WAIT = 60  # seconds for one put or get through LMCache's loop
MODES = {"meta": True, "zero-copy": False}
CASES = [(m, s) for m in MODES for s in ("file", "extra")]


@dataclass
class Backends:
    cfg: object
    cpu: object  # LocalCPUBackend
    remote: object  # RemoteBackend
    connector: MooncakestoreConnector
    mode: str
    seed: int  # distinct per case, so cases sharing the cluster never share keys


@pytest.fixture(params=CASES, ids=[f"{m}-{s}" for m, s in CASES])
def backends(request, cluster, loop, tmp_path, monkeypatch):
    mode, source = request.param
    settings = mooncake_settings(cluster.master)
    # LMCache bounds each put by transfer_timeout (1 s by default); a loaded
    # 2-core CI machine can take longer, and a put cut short is only logged.
    extra = {"save_chunk_meta": MODES[mode], "save_unfull_chunk": True, "transfer_timeout": WAIT}
    if source == "file":
        path = tmp_path / "mooncake.json"
        path.write_text(json.dumps({**settings, "transfer_timeout": WAIT}))
        monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    else:
        monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
        extra.update({"mooncake_" + k: v for k, v in settings.items()})
        # Places the chunks on this client's own segment (ReplicateConfig
        # preferred_segment = store.get_hostname()).
        extra["mooncake_prefer_local_alloc"] = True
    # LMCache ignores the URL's host:port (the master comes from the settings).
    cfg = engine_config(remote_url="mooncakestore://127.0.0.1:50051/", save_unfull_chunk=True,
                        extra_config=extra)
    made = CreateStorageBackends(cfg, metadata(), loop)
    assert list(made) == ["LocalCPUBackend", "RemoteBackend"]
    cpu, remote = made["LocalCPUBackend"], made["RemoteBackend"]
    # RemoteBackend logs and swallows a connector that failed to come up.
    assert remote.connection is not None, "LMCache could not create its mooncakestore connector"
    conn = remote.connection._connector  # under LMCache's InstrumentedRemoteConnector
    assert isinstance(conn, MooncakestoreConnector)
    assert conn.save_chunk_meta is MODES[mode]
    assert conn.registered_buffer_ptr is not None, "register_buffer of LMCache's pinned pool failed"
    if source == "extra":
        assert conn.replica_config.preferred_segment == conn.store.get_hostname() != ""
    yield Backends(cfg, cpu, remote, conn, mode, 1000 * (CASES.index(request.param) + 1))
    remote.close()
    cpu.close()


@pytest.fixture(scope="module")
def peer_store(cluster):
    """A second, independent client of the same cluster (no segment of its own)."""
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.master) == 0
    yield s
    s.close()


def chunks_of(b: Backends, n_tokens: int, seed: int):
    """LMCache's keys for n_tokens random tokens, and a memory object per
    chunk from LMCache's CPU backend filled with random bytes."""
    md = metadata()
    out = []
    for i, (start, end, key) in enumerate(chunk_keys(random_tokens(n_tokens, seed), b.cfg)):
        obj = b.cpu.allocate(md.get_shapes(end - start), md.get_dtypes())
        assert obj is not None, "LMCache's CPU backend could not allocate a chunk"
        out.append((key, obj, fill(obj, seed + i)))
    return out


def put_all(b: Backends, chunks) -> None:
    """The first chunk through submit_put_task (the connector's put), the rest
    through batched_submit_put_task (its batched_put), as LMCache's storage
    manager does; waits until LMCache reports every write done."""
    first_key, first_obj, _ = chunks[0]
    b.remote.submit_put_task(first_key, first_obj).result(WAIT)
    rest = chunks[1:]
    done = threading.Semaphore(0)
    b.remote.batched_submit_put_task([k for k, _, _ in rest], [o for _, o, _ in rest],
                                     on_complete_callback=lambda key: done.release())
    for _ in rest:
        assert done.acquire(timeout=WAIT), "LMCache's batched put did not complete"
    assert b.remote.put_failed_count == 0


def release(chunks) -> None:
    for _, obj, _ in chunks:
        obj.ref_count_down()


def async_contains(b: Backends, keys) -> int:
    """LMCache's prefix hit count (its async lookup path)."""
    fut = asyncio.run_coroutine_threadsafe(b.remote.batched_async_contains("e2e", keys), b.remote.loop)
    return fut.result(WAIT)


def test_put_contains_batched_get(backends):
    b = backends
    # Three full chunks and a half one (the zero-copy read returns fewer
    # bytes for it: LMCache reshapes the chunk by the bytes read).
    chunks = chunks_of(b, 3 * CHUNK + CHUNK // 2, b.seed)
    assert len(chunks) == 4
    keys = [k for k, _, _ in chunks]
    assert not any(b.remote.contains(k) for k in keys), "keys present before any put"
    put_all(b, chunks)

    for k in keys:
        assert b.remote.contains(k) is True or b.remote.contains(k) == 1, k.to_string()
    assert async_contains(b, keys) == len(keys)

    got = b.remote.batched_get_blocking(keys)
    for (key, obj, want), g in zip(chunks, got):
        assert g is not None, f"{key.to_string()}: LMCache's batched get found nothing"
        # (LMCache's zero-copy reshape of a part chunk updates its size and
        # shape but not get_shapes(), so the size is what to compare.)
        assert g.get_size() == obj.get_size()
        assert mismatches(want, g.byte_array) == 0, f"{key.to_string()}: bytes differ"
        g.ref_count_down()
    release(chunks)


def test_missing_key_is_absent(backends):
    b = backends
    chunks = chunks_of(b, 2 * CHUNK, b.seed + 100)
    put_all(b, chunks)
    unstored = chunks_of(b, 3 * CHUNK, b.seed + 200)  # keys of tokens never stored
    release(unstored)
    never = unstored[2]
    (k0, _, want0), (k1, _, want1) = chunks
    assert not b.remote.contains(never[0]), "a key never put is reported present"
    assert async_contains(b, [k0, never[0], k1]) == 1
    got = b.remote.batched_get_blocking([k0, never[0], k1])
    assert got[1] is None, "a key never put came back from the batched get"
    assert mismatches(want0, got[0].byte_array) == 0
    assert mismatches(want1, got[2].byte_array) == 0
    got[0].ref_count_down()
    got[2].ref_count_down()
    release(chunks)


def test_stored_layout_and_corruption_detected(backends, peer_store):
    """Another client reads the object LMCache wrote (the layout of its mode),
    then overwrites it with one KV byte flipped: LMCache's get returns exactly
    that difference, so the byte-for-byte check above would catch bad data."""
    b = backends
    chunks = chunks_of(b, CHUNK, b.seed + 300)
    put_all(b, chunks)
    key, obj, want = chunks[0]
    name = key.to_string()
    stored = peer_store.get(name)
    header = b.connector.remote_metadata_bytes if b.mode == "meta" else 0
    assert len(stored) == header + len(want)
    if header:
        meta = RemoteMetadata.deserialize(memoryview(stored)[:header])
        assert (meta.length, meta.shapes, meta.dtypes) == (len(want), obj.get_shapes(), obj.get_dtypes())
    assert mismatches(want, stored[header:]) == 0

    bad = bytearray(stored)
    bad[header + 123] ^= 0x5A
    assert peer_store.upsert(name, bytes(bad)) == 0
    got = b.remote.batched_get_blocking([key])[0]
    assert got is not None
    assert mismatches(want, got.byte_array) == 1
    got.ref_count_down()
    release(chunks)


def node_cpus(node: int) -> set:
    """The CPUs of a NUMA node from sysfs (empty: no such node)."""
    try:
        text = Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip()
    except OSError:
        return set()
    out = set()
    for part in filter(None, text.split(",")):
        a, _, z = part.partition("-")
        out.update(range(int(a), int(z or a) + 1))
    return out


# Node 4095 exists on no host: the negative control (no binding, no failure).
@pytest.mark.parametrize("node", [0, 4095])
def test_numa_binding(cluster, loop, monkeypatch, node):
    """With a GPU-to-NUMA mapping (numa_mode manual; the CPU stub device is
    device 0), LMCache's connector calls mooncake.store.bind_to_numa_node
    before setup: the calling thread then runs on that node's CPUs. The
    thread starts on one CPU so the binding is visible on a one-node host."""
    cpus = node_cpus(0)
    if len(cpus) < 2:
        pytest.skip("NUMA node 0 has fewer than two CPUs: a binding would not show")
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    extra = {"save_chunk_meta": False, "gpu_to_numa_mapping": {0: node}}
    extra.update({"mooncake_" + k: v for k, v in mooncake_settings(cluster.master).items()})
    cfg = engine_config(remote_url="mooncakestore://127.0.0.1:50051/", numa_mode="manual", extra_config=extra)
    before = os.sched_getaffinity(0)
    start = {min(cpus)}
    os.sched_setaffinity(0, start)
    try:
        made = CreateStorageBackends(cfg, metadata(), loop)
        after = os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, before)
    try:
        assert made["RemoteBackend"].connection is not None
        assert after == (node_cpus(node) or start)
    finally:
        made["RemoteBackend"].close()
        made["LocalCPUBackend"].close()
