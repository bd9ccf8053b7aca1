"""mooncake.store.MooncakeDistributedStore, driven exactly the way vLLM's
MooncakeStoreConnector, SGLang's mooncake HiCache backend and LMCache's
mooncakestore connector drive it (CPU buffers)."""

from __future__ import annotations

import threading
import uuid

import pytest

from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction

from conftest import LOCAL_BUFFER, SEGMENT, numpy_or_skip, torch_or_none


@pytest.fixture
def stores():
    made = []

    def add(s):
        made.append(s)
        return s

    yield add
    for s in made:
        assert s.close() == 0


def setup7(master, segment=SEGMENT):
    """SGLang and LMCache: setup with 7 positional arguments."""
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, LOCAL_BUFFER, "tcp", "", master)
    assert rc == 0
    return s


def uid() -> str:
    return uuid.uuid4().hex


def test_vllm_store_connector(master, stores):
    """MooncakeStoreConnector's worker: setup(dict) with "GB"-style sizes,
    register_buffer per KV storage, batch_is_exist for dedup,
    batch_put_from_multi_buffers (one buffer per layer for each key),
    batch_get_into_multi_buffers into another worker's caches."""
    np = numpy_or_skip()
    cfg = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": "64MB",
        "local_buffer_size": "32MB",
        "protocol": "tcp",
        "rdma_devices": "",
        "master_server_addr": master,
    }
    saver = stores(MooncakeDistributedStore())
    assert saver.setup(cfg) == 0
    loader = stores(MooncakeDistributedStore())
    assert loader.setup(dict(cfg, global_segment_size="0")) == 0

    layers, blocks, block_bytes = 3, 16, 8192
    save_kv = [np.random.default_rng(i).integers(0, 255, blocks * block_bytes, dtype=np.uint8)
               for i in range(layers)]
    load_kv = [np.zeros(blocks * block_bytes, np.uint8) for _ in range(layers)]
    for t in save_kv:
        assert saver.register_buffer(t.ctypes.data, t.nbytes) == 0
    for t in load_kv:
        assert loader.register_buffer(t.ctypes.data, t.nbytes) == 0

    model = f"tiny-{uid()}"
    keys = [f"{model}@tp_rank:0@pcp0@dcp0@pp_rank:0@{h:016x}" for h in range(4)]
    blocks_of = [0, 1, 5, 7]
    addrs = [[t.ctypes.data + b * block_bytes for t in save_kv] for b in blocks_of]
    sizes = [[block_bytes] * layers for _ in blocks_of]

    assert saver.batch_is_exist(keys) == [0, 0, 0, 0]
    assert saver.batch_put_from_multi_buffers(keys, addrs, sizes) == [0, 0, 0, 0]
    assert loader.batch_is_exist(keys) == [1, 1, 1, 1]
    # The loader places them in other blocks.
    into = [2, 3, 4, 9]
    dst = [[t.ctypes.data + b * block_bytes for t in load_kv] for b in into]
    got = loader.batch_get_into_multi_buffers(keys, dst, sizes)
    assert got == [layers * block_bytes] * 4
    for src_b, dst_b in zip(blocks_of, into):
        for s, d in zip(save_kv, load_kv):
            assert np.array_equal(s[src_b * block_bytes:(src_b + 1) * block_bytes],
                                  d[dst_b * block_bytes:(dst_b + 1) * block_bytes])
    # A missing key reads as a negative code, not an exception.
    assert loader.batch_get_into_multi_buffers([f"{model}@missing"], dst[:1], sizes[:1])[0] < 0
    # Single-buffer keys go the same way.
    k1 = f"{model}@single"
    assert saver.batch_put_from_multi_buffers([k1], [[save_kv[0].ctypes.data]], [[block_bytes]]) == [0]
    assert loader.batch_get_into_multi_buffers([k1], [[load_kv[0].ctypes.data]], [[block_bytes]]) == [block_bytes]


def test_multi_buffers_zero_copy(master, stores):
    """batch_put_from_multi_buffers / batch_get_into_multi_buffers move the
    bytes from and into the registered buffers themselves (no contiguous
    copy in Python): odd sizes, a value read whole, per-key errors for
    unregistered buffers, mismatched lists and buffers too small (nothing
    written), a shorter value filling a prefix."""
    np = numpy_or_skip()
    import mooncake_go.store as native

    store = stores(setup7(master))
    src = np.random.default_rng(3).integers(0, 255, 1 << 20, dtype=np.uint8)
    dst = np.full(1 << 20, 0xEE, dtype=np.uint8)
    assert store.register_buffer(src.ctypes.data, src.nbytes) == 0
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    s0, d0 = src.ctypes.data, dst.ctypes.data
    k = [f"multi-{uid()}" for _ in range(4)]
    sizes = [1, 4097, 63, 131072 + 5]
    ptrs = [s0 + 7, s0 + 100, s0 + 9000, s0 + 20000]
    want = b"".join(src[p - s0:p - s0 + n].tobytes() for p, n in zip(ptrs, sizes))
    # No Python-side gathering: the native parts call carries the buffers.
    calls = []
    orig = native.Store._parts_codes

    def spy(self, get, keys, addrs, lens, *rest):
        calls.append((get, [list(a) for a in addrs]))
        return orig(self, get, keys, addrs, lens, *rest)

    native.Store._parts_codes = spy
    try:
        assert store.batch_put_from_multi_buffers([k[0]], [ptrs], [sizes]) == [0]
        got = store.batch_get_into_multi_buffers([k[0]], [[d0 + 11, d0 + 50000]], [[40000, 200000]])
    finally:
        native.Store._parts_codes = orig
    assert calls == [(False, [ptrs]), (True, [[d0 + 11, d0 + 50000]])]
    assert got == [len(want)]
    assert store.get(k[0]) == want
    assert dst[11:40011].tobytes() + dst[50000:50000 + len(want) - 40000].tobytes() == want
    assert (dst[:11] == 0xEE).all() and (dst[40011:50000] == 0xEE).all()
    assert (dst[50000 + len(want) - 40000:250000] == 0xEE).all()

    # Per-key failures: an unregistered buffer, lists that differ in
    # length; the other keys of the batch go through.
    loose = np.zeros(4096, dtype=np.uint8)
    codes = store.batch_put_from_multi_buffers(
        [k[1], k[2], k[3]], [[s0, loose.ctypes.data], [s0, s0 + 10], [s0 + 5]], [[10, 10], [10], [99]])
    assert codes == [-600, -600, 0]
    assert store.batch_is_exist([k[1], k[2], k[3]]) == [0, 0, 1]
    # Buffers too small for the value: -600 and nothing written.
    dst[:] = 0xEE
    assert store.batch_get_into_multi_buffers([k[0]], [[d0, d0 + 100000]], [[1000, 1000]]) == [-600]
    assert (dst == 0xEE).all()
    assert store.batch_get_into_multi_buffers([k[0]], [[loose.ctypes.data]], [[len(want)]]) == [-600]
    # A value no segment can hold: -200 (NO_AVAILABLE_HANDLE), which vLLM
    # reads as memory pressure. The memory is only reserved, never read:
    # the master refuses before any byte moves.
    huge = np.empty(600 << 20, dtype=np.uint8)
    h0 = huge.ctypes.data
    assert store.register_buffer(h0, huge.nbytes) == 0
    assert store.batch_put_from_multi_buffers([f"multi-{uid()}"], [[h0, h0 + (300 << 20)]],
                                              [[300 << 20, 300 << 20]]) == [-200]
    assert store.unregister_buffer(h0) == 0
    # Outer lists that differ in number, and a store not set up.
    assert store.batch_put_from_multi_buffers([k[0], k[1]], [[s0]], [[1]]) == [-600, -600]
    assert MooncakeDistributedStore().batch_get_into_multi_buffers([k[0]], [[d0]], [[1]])[0] < 0


def test_sglang_hicache_backend(master, stores):
    """SGLang's MooncakeStore: 7-positional setup, warm-up put/is_exist/get,
    register_buffer(kv_buffer.data_ptr(), nbytes), batch_put_from /
    batch_get_into with per-page pointers, batch_is_exist, remove_all."""
    np = numpy_or_skip()
    store = stores(setup7(master))
    warm = f"mooncake_warmup_{uid()}"
    assert store.put(warm, b"x" * 4096) == 0
    assert store.is_exist(warm) == 1
    assert store.get(warm) == b"x" * 4096

    torch = torch_or_none()
    page_bytes, pages = 16384, 8
    if torch is not None:
        kv_buffer = torch.randint(0, 255, (pages * 2, page_bytes), dtype=torch.uint8)
        data_ptr, nbytes = kv_buffer.data_ptr(), kv_buffer.numel() * kv_buffer.element_size()
        snapshot = kv_buffer.numpy().copy()
    else:
        kv_buffer = np.random.default_rng(11).integers(0, 255, (pages * 2, page_bytes), dtype=np.uint8)
        data_ptr, nbytes = kv_buffer.ctypes.data, kv_buffer.nbytes
        snapshot = kv_buffer.copy()
    assert store.register_buffer(data_ptr, nbytes) == 0

    tp_rank = 0
    hashes = [uid() for _ in range(pages)]
    keys, ptrs, sizes = [], [], []
    for i, h in enumerate(hashes):  # MHA: a K and a V page per hash
        keys += [f"{h}_{tp_rank}_k", f"{h}_{tp_rank}_v"]
        ptrs += [data_ptr + (2 * i) * page_bytes, data_ptr + (2 * i + 1) * page_bytes]
        sizes += [page_bytes, page_bytes]
    assert store.batch_is_exist(keys) == [0] * len(keys)
    assert store.batch_put_from(keys, ptrs, sizes) == [0] * len(keys)
    assert store.batch_is_exist(keys) == [1] * len(keys)
    # Overwrite the host buffer, then load back the pages.
    if torch is not None:
        kv_buffer.zero_()
    else:
        kv_buffer[:] = 0
    got = store.batch_get_into(keys, ptrs, sizes)
    assert got == [page_bytes] * len(keys) and all(n > 0 for n in got)
    restored = kv_buffer.numpy() if torch is not None else kv_buffer
    assert np.array_equal(restored, snapshot)

    # clear(): objects just read hold a lease (as in Mooncake) and stay
    # unless forced.
    assert store.remove_all() >= 0
    assert store.remove_all(True) >= len(keys)
    assert store.batch_is_exist(keys) == [0] * len(keys)
    assert store.unregister_buffer(data_ptr) == 0


def test_lmcache_connector(master, stores):
    """LMCache's MooncakestoreConnector: setup (7 positional),
    ReplicateConfig with preferred_segment = get_hostname(), register the
    pinned pool, is_exist, put_from (zero-copy mode), batch_get_into,
    the legacy put_parts / batch_get_buffer, unregister_buffer, close."""
    np = numpy_or_skip()
    store = stores(setup7(master))
    rc = ReplicateConfig()
    rc.replica_num = 1
    rc.preferred_segment = store.get_hostname()
    assert rc.preferred_segment.startswith("127.0.0.1:")

    chunk = 32 << 10
    pool = np.zeros(8 * chunk, np.uint8)  # the pinned CPU pool
    assert store.register_buffer(pool.ctypes.data, pool.nbytes) == 0
    pool[:chunk] = np.random.default_rng(4).integers(0, 255, chunk, dtype=np.uint8)
    key = f"vllm@tiny@1@0@{uid()}"
    assert store.is_exist(key) == 0
    assert store.put_from(key, pool.ctypes.data, chunk, rc) == 0
    assert store.is_exist(key) == 1
    got = store.batch_get_into([key], [pool.ctypes.data + chunk], [chunk])
    assert got == [chunk]
    assert np.array_equal(pool[:chunk], pool[chunk:2 * chunk])

    # Legacy mode: a metadata header and the KV bytes as one object.
    key2 = f"vllm@tiny@1@0@{uid()}"
    meta, kv = b"M" * 28, bytes(range(256)) * 16
    assert store.put_parts(key2, meta, kv, config=rc) == 0
    (h,) = store.batch_get_buffer([key2])
    assert h.size() == len(meta) + len(kv)
    import ctypes

    assert ctypes.string_at(h.ptr(), h.size()) == meta + kv
    assert bytes(memoryview(h)) == meta + kv
    assert store.unregister_buffer(pool.ctypes.data) == 0


def test_official_misc_calls(master, stores):
    np = numpy_or_skip()
    s = stores(setup7(master))
    k = f"misc-{uid()}"
    assert s.get(k) == b""  # missing: empty
    assert s.is_exist(k) == 0
    assert s.get_size(k) < 0
    assert s.remove(k) < 0
    assert s.put(k, b"abc") == 0
    assert s.get_size(k) == 3
    assert s.upsert(k, b"abcd") == 0 and s.get(k) == b"abcd"
    buf = np.zeros(2, np.uint8)
    assert s.get_into(k, buf.ctypes.data, 2) < 0  # too small
    big = np.zeros(16, np.uint8)
    assert s.get_into(k, big.ctypes.data, 16) == 4 and bytes(big[:4]) == b"abcd"
    keys = [f"misc-{uid()}" for _ in range(3)]
    assert s.put_batch(keys, [b"1", b"2", b"3"]) == 0
    assert s.get_batch(keys) == [b"1", b"2", b"3"]
    assert s.upsert_batch(keys, [b"4", b"5", b"6"]) == 0
    assert s.get_batch(keys) == [b"4", b"5", b"6"]
    assert s.batch_remove(keys, force=True) == [0, 0, 0]
    assert s.batch_remove([keys[0], ""], True) == [-704, -600]  # gone; empty key
    assert s.batch_is_exist(keys) == [0, 0, 0]
    rc = ReplicateConfig()
    rc.with_soft_pin = True
    assert rc.soft_pin_action == SoftPinAction.ENABLE
    rc.with_hard_pin = True
    assert s.put(f"pin-{uid()}", b"p", rc) == 0
    assert s.health_check() == 0
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL_BUFFER, "tcp", "", master) < 0  # already set up

    reg = np.arange(1024, dtype=np.uint8)
    assert s.register_buffer(reg.ctypes.data, reg.nbytes) == 0
    ks = [f"bu-{uid()}", f"bu-{uid()}"]
    assert s.batch_put_from(ks, [reg.ctypes.data, reg.ctypes.data + 512], [512, 512]) == [0, 0]
    assert s.batch_upsert_from(ks, [reg.ctypes.data + 512, reg.ctypes.data], [512, 512]) == [0, 0]
    assert s.get(ks[0]) == bytes(reg[512:])
    assert s.upsert_from(ks[1], reg.ctypes.data, 10) == 0 and s.get(ks[1]) == bytes(reg[:10])
    assert s.put_from_with_metadata(f"m-{uid()}", reg.ctypes.data, reg.ctypes.data + 1000, 10, 4) == 0
    assert s.batch_put_from(ks, [reg.ctypes.data], [1]) == [-600, -600]  # lists differ
    assert s.unregister_buffer(reg.ctypes.data) == 0


def test_remove_by_regex(master, stores):
    """remove_by_regex: the number removed; leased objects only with force;
    a bad pattern is a negative code (INVALID_PARAMS) and removes nothing."""
    s = stores(setup7(master))
    req = uid()
    ours = [f"{req}/blk{i}" for i in range(3)]
    other = f"x{req}/blk0"
    for k in ours + [other]:
        assert s.put(k, b"kv") == 0
    assert s.remove_by_regex(f"^{req}/blk[01]$") == 2
    assert s.batch_is_exist(ours + [other]) == [0, 0, 1, 1]
    assert s.get(ours[2]) == b"kv"  # now leased
    assert s.remove_by_regex(f"^{req}/", False) == 0
    assert s.remove_by_regex(f"^{req}/", force=True) == 1
    assert s.remove_by_regex("blk[") == -600
    assert s.remove_by_regex("") == -600
    assert s.is_exist(other) == 1
    assert MooncakeDistributedStore().remove_by_regex(".") < 0  # not set up


def test_not_set_up_and_closed(master):
    s = MooncakeDistributedStore()
    assert s.put("k", b"v") < 0 and s.get("k") == b"" and s.is_exist("k") == -1
    assert s.batch_is_exist(["a", "b"]) == [-1, -1]
    assert s.health_check() == 1
    assert s.setup({"local_hostname": "127.0.0.1"}) < 0  # metadata_server missing
    assert s.close() == 0
    s = setup7(master, segment=0)
    assert s.close() == 0
    assert s.put("k", b"v") < 0


def test_setup_with_engine(master):
    """setup(..., engine=TransferEngine.get_engine()): the store moves bytes
    with an engine the caller started."""
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", master, te.get_engine()) == 0
    k = f"eng-{uid()}"
    assert s.put(k, b"via engine") == 0 and s.get(k) == b"via engine"
    assert s.get_hostname() == f"127.0.0.1:{te.get_rpc_port()}"
    assert s.close() == 0
    te.close()


def test_threads_share_one_compat_store(master, stores):
    np = numpy_or_skip()
    s = stores(setup7(master))
    n, size = 8, 32 << 10
    buf = np.zeros(n * size * 2, np.uint8)
    assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    bad = []

    def work(i):
        src = buf.ctypes.data + i * 2 * size
        dst = src + size
        for r in range(10):
            buf[i * 2 * size:i * 2 * size + size] = (i * 7 + r) % 256
            k = f"t{i}-{r}-{uid()}"
            if s.batch_put_from([k], [src], [size]) != [0]:
                bad.append(("put", i, r))
            if s.batch_get_into([k], [dst], [size]) != [size]:
                bad.append(("get", i, r))
            if not (buf[i * 2 * size + size:(i + 1) * 2 * size] == (i * 7 + r) % 256).all():
                bad.append(("data", i, r))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad, bad
    assert s.unregister_buffer(buf.ctypes.data) == 0
