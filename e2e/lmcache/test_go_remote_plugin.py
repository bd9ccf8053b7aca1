"""Our LMCache remote storage plugin (connectors/lmcache, shipped as
mooncake_go.connectors.lmcache) loaded by LMCache itself: its
CreateStorageBackends reads `remote_storage_plugins: ["mooncake_go"]` and
the plugin's module_path/class_name from extra_config, imports our
adapter and builds a RemoteBackend over our connector, on a real
`mooncake up`. Everything below goes through LMCache's RemoteBackend (put
tasks, contains, prefix lookups, batched gets), plus our lookup client.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
from lmcharness import CHUNK, chunk_keys, engine_config, fill, metadata, mismatches, random_tokens
from lmcache.v1.storage_backend import CreateStorageBackends

from mccluster import free_port, start_cluster
from mooncake_go import Store
from mooncake_go.connectors.lmcache import MooncakeGoConnector, MooncakeGoLookupClient
from mooncake_go.connectors.lmcache.connector import PutFailed

WAIT = 60
P = "remote_storage_plugin.mooncake_go."
BACKEND = "RemoteBackend-mooncake_go"


def plugin_extra(master: str, **settings) -> dict:
    extra = {P + "module_path": "mooncake_go.connectors.lmcache", P + "class_name": "MooncakeGoAdapter",
             P + "master": master, P + "local_hostname": "127.0.0.1", P + "timeout": 10}
    extra.update({P + k: v for k, v in settings.items()})
    return extra


def make_backends(master: str, loop, **settings):
    cfg = engine_config(remote_storage_plugins=["mooncake_go"], save_unfull_chunk=True,
                        extra_config=plugin_extra(master, **settings))
    made = CreateStorageBackends(cfg, metadata(), loop)
    return cfg, made


class Plugin:
    def __init__(self, cfg, made):
        self.cfg = cfg
        self.cpu = made["LocalCPUBackend"]
        self.remote = made[BACKEND]
        # RemoteBackend logs and swallows a connector that failed to come up.
        assert self.remote.connection is not None, "LMCache could not create the mooncake_go connector"
        self.conn = self.remote.connection._connector  # under LMCache's InstrumentedRemoteConnector

    def close(self):
        self.remote.close()
        self.cpu.close()


@pytest.fixture(scope="module")
def plugin(cluster, loop):
    cfg, made = make_backends(cluster.master, loop)
    assert list(made) == ["LocalCPUBackend", BACKEND]
    p = Plugin(cfg, made)
    yield p
    p.close()


@pytest.fixture(scope="module")
def peer(cluster):
    """Another client of the same cluster (no segment of its own)."""
    with Store(cluster.master, segment_size=-1, local_buffer_size=16 << 20, local_hostname="127.0.0.1") as s:
        yield s


def chunks_of(p: Plugin, n_tokens: int, seed: int):
    md = metadata()
    out = []
    for i, (start, end, key) in enumerate(chunk_keys(random_tokens(n_tokens, seed), p.cfg)):
        obj = p.cpu.allocate(md.get_shapes(end - start), md.get_dtypes())
        assert obj is not None
        out.append((key, obj, fill(obj, seed + i)))
    return out


def put_all(p: Plugin, chunks) -> None:
    """The first chunk through submit_put_task (the connector's put), the
    rest through batched_submit_put_task (its batched_put)."""
    before = p.remote.put_failed_count
    p.remote.submit_put_task(chunks[0][0], chunks[0][1]).result(WAIT)
    rest = chunks[1:]
    done = threading.Semaphore(0)
    p.remote.batched_submit_put_task([k for k, _, _ in rest], [o for _, o, _ in rest],
                                     on_complete_callback=lambda key: done.release())
    for _ in rest:
        assert done.acquire(timeout=WAIT), "LMCache's batched put did not complete"
    assert p.remote.put_failed_count == before


def release(chunks) -> None:
    for _, obj, _ in chunks:
        obj.ref_count_down()


def entered(p: Plugin, name: str) -> threading.Event:
    """An event set when the connector's store client starts a call of its
    method name (the call itself unchanged): a test that cancels a call
    in flight waits for it, not for a while."""
    store = p.conn._link.get()
    started = threading.Event()
    call = getattr(store, name)

    def wrapped(*args, **kwargs):
        started.set()
        return call(*args, **kwargs)

    setattr(store, name, wrapped)
    return started


def run(p: Plugin, coro):
    return asyncio.run_coroutine_threadsafe(coro, p.remote.loop).result(WAIT)


def in_pool(p: Plugin, obj) -> bool:
    return any(a <= obj.data_ptr and obj.data_ptr + obj.get_size() <= a + n for a, n in p.conn.registered_regions)


def test_loaded_as_plugin_with_pool_registered(plugin):
    """LMCache made our connector from the plugin settings, and the pinned
    pool of its CPU backend is the one region registered with the store."""
    assert isinstance(plugin.conn, MooncakeGoConnector)
    buf = plugin.cpu.memory_allocator.buffer
    assert plugin.conn.registered_regions == [(buf.data_ptr(), buf.numel())]


def test_put_contains_batched_get(plugin, peer):
    # Three full chunks and a half one (its stored length says how many
    # tokens it holds; LMCache reshapes it on the way back).
    chunks = chunks_of(plugin, 3 * CHUNK + CHUNK // 2, 100)
    assert len(chunks) == 4
    keys = [k for k, _, _ in chunks]
    assert not any(plugin.remote.contains(k) for k in keys), "keys present before any put"
    assert run(plugin, plugin.remote.batched_async_contains("t", keys)) == 0
    put_all(plugin, chunks)

    assert all(plugin.remote.contains(k) for k in keys)
    assert run(plugin, plugin.remote.batched_async_contains("t", keys)) == len(keys)
    assert plugin.conn.batched_contains(keys) == len(keys)
    # What is stored is the chunk's KV bytes, nothing else.
    for key, obj, want in chunks:
        assert mismatches(want, peer.get(key.to_string())) == 0, key.to_string()

    got = plugin.remote.batched_get_blocking(keys)
    for (key, obj, want), g in zip(chunks, got):
        assert g is not None, f"{key.to_string()}: the batched get found nothing"
        assert g.get_size() == obj.get_size()
        assert mismatches(want, g.byte_array) == 0, f"{key.to_string()}: bytes differ"
        assert in_pool(plugin, g), "a chunk was read outside LMCache's registered pool"
        g.ref_count_down()
    # The single get and the non-blocking batched get (LMCache's async
    # loading path) take the same way.
    one = run(plugin, plugin.remote.connection.get(keys[1]))
    assert mismatches(chunks[1][2], one.byte_array) == 0
    one.ref_count_down()
    got = run(plugin, plugin.remote.batched_get_non_blocking("t", keys))
    assert [mismatches(w, g.byte_array) for (_, _, w), g in zip(chunks, got)] == [0] * len(keys)
    for g in got:
        g.ref_count_down()
    release(chunks)


def test_missing_keys(plugin):
    """Negative controls: keys never stored are absent everywhere, end a
    prefix lookup, come back None from the batched get and end the
    non-blocking get's run; a put of a key that exists is no failure."""
    chunks = chunks_of(plugin, 2 * CHUNK, 200)
    put_all(plugin, chunks)
    never = chunks_of(plugin, 3 * CHUNK, 300)
    release(never)
    (k0, _, want0), (k1, _, want1) = chunks
    nk = never[2][0]
    assert not plugin.remote.contains(nk)
    assert run(plugin, plugin.remote.batched_async_contains("t", [k0, nk, k1])) == 1
    assert run(plugin, plugin.remote.batched_async_contains("t", [nk, k0])) == 0
    pool = plugin.cpu.memory_allocator.pin_allocator
    active = pool.num_active_allocations
    got = plugin.remote.batched_get_blocking([k0, nk, k1])
    assert got[1] is None, "a key never put came back from the batched get"
    assert mismatches(want0, got[0].byte_array) == 0 and mismatches(want1, got[2].byte_array) == 0
    got[0].ref_count_down()
    got[2].ref_count_down()
    run_ = run(plugin, plugin.remote.batched_get_non_blocking("t", [k0, nk, k1]))
    assert len(run_) == 1 and mismatches(want0, run_[0].byte_array) == 0
    run_[0].ref_count_down()
    # Every chunk read (the one past the miss too) went back to the pool.
    assert pool.num_active_allocations == active
    put_all(plugin, chunks)  # write-once: stored already counts as stored
    release(chunks)


def test_corruption_is_visible(plugin, peer):
    """Negative control of the byte checks: another client overwrites a
    stored chunk with one byte flipped; the plugin returns exactly that
    difference."""
    chunks = chunks_of(plugin, CHUNK, 400)
    put_all(plugin, chunks)
    key, _, want = chunks[0]
    bad = bytearray(want)
    bad[123] ^= 0x5A
    peer.upsert(key.to_string(), bytes(bad))
    got = plugin.remote.batched_get_blocking([key])[0]
    assert got is not None and mismatches(want, got.byte_array) == 1
    got.ref_count_down()
    release(chunks)


def test_lookup_client(plugin, cluster, peer):
    """Our lookup client answers a prompt's stored prefix with one batch
    exists; keys meet those the plugin stored (both from LMCache's token
    database). A removed chunk ends the hit; unstored tokens hit nothing."""
    client = MooncakeGoLookupClient(plugin.cfg, metadata())
    try:
        prompt = random_tokens(4 * CHUNK, 500)
        assert client.lookup(prompt) == 0
        md = metadata()
        chunks = []
        for i, (s, e, k) in enumerate(chunk_keys(prompt, plugin.cfg)):
            obj = plugin.cpu.allocate(md.get_shapes(e - s), md.get_dtypes())
            chunks.append((k, obj, fill(obj, 500 + i)))
        put_all(plugin, chunks)
        release(chunks)
        assert client.lookup(prompt) == 4 * CHUNK
        assert client.lookup(prompt[:2 * CHUNK]) == 2 * CHUNK
        assert client.lookup(prompt[:2 * CHUNK] + random_tokens(2 * CHUNK, 501)) == 2 * CHUNK
        assert client.lookup(random_tokens(4 * CHUNK, 502)) == 0
        peer.remove(chunks[1][0].to_string(), force=True)
        assert client.lookup(prompt) == CHUNK
    finally:
        client.close()


def test_bad_settings_refused(cluster, loop):
    """A typo under the plugin's prefix, or no master, keeps LMCache from
    making the connector (it reports the backend without a connection)."""
    for extra in (plugin_extra(cluster.master, segmnet_size="1GB"), plugin_extra("")):
        cfg = engine_config(remote_storage_plugins=["mooncake_go"], extra_config=extra)
        made = CreateStorageBackends(cfg, metadata(), loop)
        try:
            assert made[BACKEND].connection is None
        finally:
            made["LocalCPUBackend"].close()


def put_one(p: Plugin, chunk) -> bool:
    """A put through LMCache's submit_put_task; whether it stored the chunk
    (its future carries the connector's PutFailed)."""
    try:
        p.remote.submit_put_task(chunk[0], chunk[1]).result(WAIT)
    except PutFailed:
        return False
    return p.remote.contains(chunk[0])


def wait_for(cond, what: str, timeout: float = WAIT):
    """Polls cond until it holds (the store comes back on its own time)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_store_restart(mooncake_bin, loop):
    """The store goes away under a running LMCache and comes back on the
    same address: meanwhile puts fail (LMCache counts them), lookups say
    absent and gets return None, nothing raises out of LMCache; afterwards
    the plugin reconnects by itself and round trips work again (the old
    chunks went with the restarted node)."""
    port = free_port()
    args = ("--no-ha", "--nodes", "1", "--global_segment_size", "256MiB", "--rpc_port", str(port))
    cluster = start_cluster(mooncake_bin, *args)
    p = None
    try:
        cfg, made = make_backends(cluster.master, loop, retry=0.5, timeout=3)
        p = Plugin(cfg, made)
        lookup = MooncakeGoLookupClient(cfg, metadata())
        before = chunks_of(p, 2 * CHUNK, 600)
        put_all(p, before)
        keys = [k for k, _, _ in before]
        assert run(p, p.remote.batched_async_contains("t", keys)) == 2

        cluster.stop()
        failed = p.remote.put_failed_count
        assert not put_one(p, before[0]), "a put to a stopped store succeeded"
        wait_for(lambda: p.remote.put_failed_count == failed + 1, "LMCache to count the failed put")
        assert p.remote.contains(keys[0]) is False
        assert run(p, p.remote.batched_async_contains("t", keys)) == 0
        assert p.remote.batched_get_blocking(keys) == [None, None]
        assert lookup.lookup(random_tokens(2 * CHUNK, 600)) == 0
        assert run(p, p.remote.connection.ping()) != 0

        cluster = start_cluster(mooncake_bin, *args)
        wait_for(lambda: run(p, p.remote.connection.ping()) == 0, "the plugin to reach the restarted store")
        assert p.remote.batched_get_blocking(keys) == [None, None], "chunks of the stopped node came back"
        after = chunks_of(p, 2 * CHUNK, 700)
        wait_for(lambda: put_one(p, after[0]), "a put to succeed again")
        put_all(p, after)
        got = p.remote.batched_get_blocking([k for k, _, _ in after])
        assert [mismatches(w, g.byte_array) for (_, _, w), g in zip(after, got)] == [0, 0]
        for g in got:
            g.ref_count_down()
        assert lookup.lookup(random_tokens(2 * CHUNK, 700)) == 2 * CHUNK
        release(before)
        release(after)
        lookup.close()
    finally:
        if p is not None:
            p.close()
        cluster.stop()


def test_allocator_without_pool(plugin, loop):
    """An allocator that exposes no contiguous buffer (LMCache's ad hoc
    allocator: one tensor per memory object): the plugin registers each
    object's tensor storage as it meets it, and round trips still match."""
    from collections import OrderedDict

    from lmcache.v1.memory_allocators.ad_hoc_memory_allocator import AdHocMemoryAllocator
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    cfg = plugin.cfg
    cpu = LocalCPUBackend(cfg, metadata(), "cpu", memory_allocator=AdHocMemoryAllocator("cpu"))
    made = CreateStorageBackends(cfg, metadata(), loop, existing_backends=OrderedDict(LocalCPUBackend=cpu),
                                 skip_backends={"LocalCPUBackend"})
    p = Plugin(cfg, {"LocalCPUBackend": cpu, BACKEND: made[BACKEND]})
    try:
        assert p.conn.registered_regions == []
        chunks = chunks_of(p, 3 * CHUNK, 800)
        put_all(p, chunks)
        regions = p.conn.registered_regions
        assert all(any(a <= o.data_ptr < a + n for a, n in regions) for _, o, _ in chunks)
        got = p.remote.batched_get_blocking([k for k, _, _ in chunks])
        assert [mismatches(w, g.byte_array) for (_, _, w), g in zip(chunks, got)] == [0, 0, 0]
        assert all(in_pool(p, g) for g in got), "a chunk was read outside the registered storages"
        for g in got:
            g.ref_count_down()
        release(chunks)
    finally:
        p.close()


def cancel_in_flight(cluster, loop, p: Plugin, method: str, call, what: str, busy: int, idle: int) -> None:
    """Runs call() (a coroutine of the connector) on LMCache's loop with the
    store frozen (SIGSTOP), cancels it once its store call (the store
    client's method) is in flight, and checks that the pool keeps busy
    allocations until the store is back and the call returned, and idle
    after: buffers the store may still use are not handed out again."""
    pool = p.cpu.memory_allocator.pin_allocator
    in_call = entered(p, method)

    async def start():
        return asyncio.ensure_future(call())

    os.kill(cluster.proc.pid, signal.SIGSTOP)
    try:
        task = asyncio.run_coroutine_threadsafe(start(), loop).result(WAIT)
        assert in_call.wait(WAIT), "the store call did not start"
        loop.call_soon_threadsafe(task.cancel)
        wait_for(task.done, f"the {what} to be cancelled")
        assert task.cancelled()
        assert pool.num_active_allocations == busy, \
            f"a cancelled {what} gave buffers back while the store call was still using them"
    finally:
        os.kill(cluster.proc.pid, signal.SIGCONT)
    wait_for(lambda: pool.num_active_allocations == idle, "the buffers to go back once the store call ended")


def test_cancelled_get_keeps_buffers_until_the_store_is_done(mooncake_bin, loop):
    """LMCache cancels a get that outlives blocking_timeout_secs, while the
    store may still be writing into the chunks' buffers: they must not go
    back to the pool (to be handed out again) until the store call
    returns, and must all go back then."""
    cluster = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "256MiB")
    p = None
    try:
        cfg, made = make_backends(cluster.master, loop, timeout=5, retry=0)
        p = Plugin(cfg, made)
        chunks = chunks_of(p, 3 * CHUNK, 900)
        put_all(p, chunks)
        release(chunks)
        keys = [k for k, _, _ in chunks]
        idle = p.cpu.memory_allocator.pin_allocator.num_active_allocations
        cancel_in_flight(cluster, loop, p, "batch_get_into", lambda: p.conn.batched_get(keys), "get",
                         busy=idle + len(keys), idle=idle)
    finally:
        if p is not None:
            p.close()
        cluster.stop()


def test_cancelled_put_keeps_buffers_until_the_store_is_done(mooncake_bin, loop):
    """A put cancelled while the store reads the chunks' buffers: LMCache's
    own wrapper (InstrumentedRemoteConnector) drops the reference it holds
    for the put as the cancellation reaches it, and the chunks must still
    not go back to the pool until the store call returns, then all go
    back."""
    cluster = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "256MiB")
    p = None
    try:
        cfg, made = make_backends(cluster.master, loop, timeout=5, retry=0)
        p = Plugin(cfg, made)
        idle = p.cpu.memory_allocator.pin_allocator.num_active_allocations
        chunks = chunks_of(p, 3 * CHUNK, 1000)
        keys, objs = [k for k, _, _ in chunks], [o for _, o, _ in chunks]
        for o in objs:
            o.ref_count_up()  # what LMCache's serializer takes for the put, for its wrapper to drop
        release(chunks)  # the chunks are the put's alone now
        cancel_in_flight(cluster, loop, p, "batch_put_from", lambda: p.remote.connection.batched_put(keys, objs),
                         "put", busy=idle + len(chunks), idle=idle)
    finally:
        if p is not None:
            p.close()
        cluster.stop()
