"""Dummy clients (setup_dummy) against a real client process (``mooncake
client``, the official mooncake_client): tensor-parallel ranks share its
pool, memory from MooncakeHostMemAllocator and alloc_from_mem_pool moves
without copies, and a dead real client fails calls instead of hanging."""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
import uuid

import pytest

import mooncake_go
from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator
from mccluster import field, refused_addr, start_cluster, start_real_client, stop_process

from conftest import LOCAL_BUFFER, SEGMENT

RPC_FAIL = -900
INVALID_PARAMS = -600


@pytest.fixture
def real_client(mooncake_bin, master):
    rc = start_real_client(mooncake_bin, master, segment="128MiB")
    yield rc
    rc.stop()


@pytest.fixture
def raw(master):
    """An ordinary store client of the same pool, to look at it directly."""
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", master) == 0
    yield s
    assert s.close() == 0


def dummy(address: str, pool: int = 8 << 20, staging: int = 1 << 20) -> MooncakeDistributedStore:
    d = MooncakeDistributedStore()
    assert d.setup_dummy(pool, staging, address) == 0
    return d


def uid() -> str:
    return uuid.uuid4().hex


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed) & 0xFF for i in range(n))


def test_tp_ranks_share_one_pool(real_client, raw):
    """Two ranks' dummies see each other's objects (TP-suffixed keys, as
    vLLM and SGLang write them), and so does an ordinary client."""
    ranks = [dummy(real_client.address) for _ in range(2)]
    try:
        key = uid()
        for r, d in enumerate(ranks):
            assert d.put(f"{key}_tp_{r}", pattern(1000 + r, r)) == 0
        for r, d in enumerate(ranks):
            other = 1 - r
            assert d.get(f"{key}_tp_{other}") == pattern(1000 + other, other)
            assert d.is_exist(f"{key}_tp_{other}") == 1
        assert raw.get(f"{key}_tp_1") == pattern(1001, 1)
        assert ranks[1].batch_is_exist([f"{key}_tp_0", uid()]) == [1, 0]
        assert ranks[0].get_size(f"{key}_tp_1") == 1001
        assert ranks[0].remove(f"{key}_tp_1", True) == 0  # force: the gets above hold a lease
        assert ranks[1].is_exist(f"{key}_tp_1") == 0
        assert ranks[1].get(uid()) == b""  # missing
        assert ranks[0].get_hostname().startswith("dummy@")
        assert ranks[0].health_check() == 0
    finally:
        for d in ranks:
            assert d.close() == 0


def test_host_allocator_memory_is_zero_copy(real_client, raw):
    """SGLang's standalone storage: the host pool comes from
    MooncakeHostMemAllocator before setup_dummy, and is registered. Its
    values are larger than the staging buffer, so they can only have
    moved through the memory the real client shares."""
    alloc = MooncakeHostMemAllocator()
    n = 1 << 20
    p, q = alloc.alloc(n), alloc.alloc(n)
    assert p and q and p % 4096 == 0
    d = dummy(real_client.address, pool=2 * n, staging=64 << 10)
    try:
        assert d.register_buffer(p, n) == 0 and d.register_buffer(q, n) == 0
        ctypes.memmove(p, pattern(n, 3), n)
        key = uid()
        assert d.batch_put_from([key], [p], [n]) == [0]
        assert d.batch_get_into([key], [q], [n]) == [n]
        assert ctypes.string_at(q, n) == pattern(n, 3)
        assert raw.get(key) == pattern(n, 3)  # one pool
        assert d.unregister_buffer(p) == 0
        # Unregistered, p is ordinary memory again: too big for staging.
        assert d.batch_put_from([uid()], [p], [n]) == [INVALID_PARAMS]
    finally:
        assert d.close() == 0
    assert alloc.free(p) == 0 and alloc.free(q) == 0
    assert alloc.free(p) == -1  # twice
    assert alloc.alloc(0) == 0


def test_freed_host_memory_is_unregistered(real_client, raw):
    """Host memory freed while a dummy has it registered is unregistered
    first. Else the dummy would go on naming the freed range as the old
    region, and memory mapped there later (mmap reuses the address) would
    silently move the freed pages the real client still maps."""
    alloc = MooncakeHostMemAllocator()
    n = 1 << 20
    d = dummy(real_client.address, pool=0, staging=64 << 10)
    try:
        p = alloc.alloc(n)
        assert p and d.register_buffer(p, n) == 0
        ctypes.memmove(p, pattern(n, 1), n)
        assert alloc.free(p) == 0
        assert p not in d._store._registered  # the dummy forgot the region
        q = alloc.alloc(n)  # usually at p again
        assert q
        ctypes.memmove(q, pattern(n, 2), n)
        assert d.register_buffer(q, n) == 0
        key = uid()
        assert d.batch_put_from([key], [q], [n]) == [0]
        assert raw.get(key) == pattern(n, 2)  # q's bytes, not the freed ones
        assert alloc.free(q) == 0
    finally:
        assert d.close() == 0


def test_registered_host_memory_cannot_shrink(real_client):
    """Host memory registered with a dummy is sealed against shrinking: a
    stray ftruncate of its memfd cannot cut pages from under the real
    client, which would die of SIGBUS at the next put from them."""
    n = 1 << 20
    p = mooncake_go.alloc_shared(n)
    d = dummy(real_client.address, pool=0)
    try:
        assert p and d.register_buffer(p, n) == 0
        _, fd, _ = mooncake_go.dummy.shared_region(p)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)
    finally:
        assert d.close() == 0
        assert mooncake_go.free_shared(p)


def test_mem_pool_and_staged_buffers(real_client, raw):
    """alloc_from_mem_pool carves the dummy's shared pool (zero-copy);
    bytes in any other memory are staged, in several rounds when a batch
    exceeds the staging buffer."""
    d = dummy(real_client.address, pool=4 << 20, staging=256 << 10)
    try:
        p = d.alloc_from_mem_pool(2 << 20)  # larger than staging
        assert p and p % 4096 == 0
        ctypes.memmove(p, pattern(2 << 20, 7), 2 << 20)
        k = uid()
        assert d.put_from(k, p, 2 << 20) == 0
        assert raw.get(k) == pattern(2 << 20, 7)
        assert d.alloc_from_mem_pool(64 << 20) == 0  # no room

        keys = [uid() for _ in range(4)]
        values = [pattern(100 << 10, i) for i in range(4)]  # 400 KiB over 256 KiB of staging
        assert d.put_batch(keys, values) == 0
        assert d.get_batch(keys) == values
        bufs = [ctypes.create_string_buffer(100 << 10) for _ in keys]
        assert d.batch_get_into(keys, [ctypes.addressof(b) for b in bufs], [len(b) for b in bufs]) == [100 << 10] * 4
        assert [b.raw for b in bufs] == values
        assert d.upsert(keys[0], b"new") == 0 and raw.get(keys[0]) == b"new"
    finally:
        assert d.close() == 0


def test_real_client_killed(mooncake_bin):
    """kill -9 of the real client: the dummy's next calls fail with
    RPC_FAIL at once, they do not hang. (A cluster of its own: the killed
    client's segment stays in its master's pool until the client TTL.)"""
    cluster = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "64MiB")
    rc = d = None
    try:
        rc = start_real_client(mooncake_bin, cluster.master, segment="64MiB")
        d = dummy(rc.address)
        assert d.put(uid(), b"x") == 0
        rc.proc.kill()
        rc.proc.wait()
        start = time.monotonic()
        assert d.put(uid(), b"y") == RPC_FAIL
        assert d.is_exist(uid()) < 0
        assert d.get(uid()) == b""
        assert time.monotonic() - start < 10
    finally:
        if d is not None:
            d.close()
        if rc is not None:
            rc.stop()
        cluster.stop()


def test_no_real_client():
    """setup_dummy without a real client at the address fails, saying so
    through its code, and the store stays unset."""
    with refused_addr() as addr:
        d = MooncakeDistributedStore()
        assert d.setup_dummy(1 << 20, 1 << 20, addr) == RPC_FAIL
        assert d.health_check() == 1
    with pytest.raises(mooncake_go.MooncakeError, match="no real client at"):
        mooncake_go.DummyStore(addr)


def test_refused_dummy(real_client):
    """A real client that refuses a dummy (more shared memory than it gives
    one: 1 TiB) makes setup_dummy return INVALID_PARAMS, and the same store
    can then set up a dummy it accepts."""
    d = MooncakeDistributedStore()
    assert d.setup_dummy(2 << 40, 1 << 20, real_client.address) == INVALID_PARAMS
    with pytest.raises(mooncake_go.MooncakeError, match="refused the dummy"):
        mooncake_go.DummyStore(real_client.address, mem_pool_size=2 << 40)
    assert d.setup_dummy(1 << 20, 1 << 20, real_client.address) == 0
    assert d.close() == 0


def bare_master(mooncake_bin):
    """``mooncake master`` alone (no storage node): (process, rpc address)."""
    proc = subprocess.Popen([str(mooncake_bin), "master", "--rpc_address", "127.0.0.1", "--rpc_port", "0",
                             "--metrics_port", "-1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("master listening"):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # never block on a full pipe
            return proc, field(line, "rpc")
    stop_process(proc)
    raise RuntimeError("mooncake master exited before listening")


def test_vllm_standalone_store_topology(mooncake_bin):
    """vLLM's MooncakeStoreConnector ``mode: standalone-store``: the ranks
    set up ordinary clients with global_segment_size 0 and the pool is the
    segment of an external mooncake_client. With a master that has no
    storage node, every object lands on the real client's segment."""
    master, addr = bare_master(mooncake_bin)
    rc = None
    ranks = []
    try:
        rc = start_real_client(mooncake_bin, addr, segment="64MiB")
        for _ in range(2):
            s = MooncakeDistributedStore()
            assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", addr) == 0
            ranks.append(s)
        key = uid()
        assert ranks[0].put(key, pattern(4096, 9)) == 0
        assert ranks[1].get(key) == pattern(4096, 9)
        segments = {d.segment_name for d in ranks[1].get_replica_desc(key)}
        owner = next(line for line in rc.lines if line.startswith("node ready")).split("=", 1)[1]
        assert segments == {owner}
    finally:
        for s in ranks:
            s.close()
        if rc is not None:
            rc.stop()
        stop_process(master)
