"""Our own HiCache storage backend (connectors/sglang, shipped as
mooncake_go.connectors.sglang) inside real SGLang 0.5.23 on CPU: built the
way SGLang's cache controller builds a ``--hicache-storage-backend
dynamic`` backend (the extra-config JSON through SGLang's own parser, a
HiCacheStorageConfig, StorageBackendFactory.create_backend("dynamic", ...),
then register_mem_pool_host) over real host KV pools (MHA page_first and
layer_first, MLA layer_first and page_first), against a real
``mooncake up``. Pages go out with batch_set_v1 and come back with
batch_get_v1 into other pages of the pool; every check compares bytes.

Harness-only choice, as in test_sglang_hicache.py: pin_memory=False."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest
import torch

from mooncake_go import Store, TransferEngine, errors
from mooncake_go.connectors.sglang import MooncakeGoHiCache, page_id64, page_key
from mccluster import free_port, start_cluster
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str, hash_str_to_int64

PAGE = 4  # tokens per page
CHECKSUM_MISMATCH = -801  # MC_STORE_ERR_CHECKSUM_MISMATCH
LAYERS = 2


def mha_pool(layout: str = "page_first") -> MHATokenToKVPoolHost:
    dev = MHATokenToKVPool(128, PAGE, torch.bfloat16, 2, 64, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)
    return MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=LAYERS, write_back_staging=dev.hicache_write_back_staging)


def mla_pool(layout: str = "layer_first") -> MLATokenToKVPoolHost:
    dev = MLATokenToKVPool(128, PAGE, torch.bfloat16, 64, 16, 3, "cpu", False, start_layer=0, end_layer=3)
    return MLATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                                start_layer=0, end_layer=3, target_layer_num=3)


POOLS = {  # name: (pool maker, is_mla)
    "mha-page_first": (lambda: mha_pool("page_first"), False),
    "mha-layer_first": (lambda: mha_pool("layer_first"), False),
    "mla-layer_first": (lambda: mla_pool("layer_first"), True),
    "mla-page_first": (lambda: mla_pool("page_first"), True),
}


def extra_json(master: str, **kw) -> str:
    return json.dumps({"backend_name": "mooncake-go", "module_path": "mooncake_go.connectors.sglang",
                       "class_name": "MooncakeGoHiCache", "interface_v1": 1, "master": master, **kw})


def attach(conf: str, host, tp_rank: int = 0, tp_size: int = 1, model_name="org/tiny"):
    """The backend as the cache controller attaches a dynamic backend."""
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(conf)
    cfg = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=isinstance(host, MLATokenToKVPoolHost), enable_storage_metrics=False,
        is_page_first_layout=host.layout == "page_first", model_name=model_name, extra_config=extra)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
    backend.register_mem_pool_host(host)
    return backend


def hashes(n: int, seed=None) -> list:
    """n chained page hashes, computed by SGLang as its controller does."""
    seed = seed or uuid.uuid4().hex
    toks = [hash(seed + str(i)) % 30000 for i in range(n * PAGE)]
    return get_hash_str(toks, None, page_size=PAGE)


def tokens(pages) -> torch.Tensor:
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def page_bytes(host, page: int) -> bytes:
    """A page's bytes wherever the layout keeps them (K then V for MHA)."""
    return host.kv_buffer.index_select(_tok_dim(host), tokens([page])).contiguous().view(torch.uint8).numpy().tobytes()


def _tok_dim(host) -> int:
    """kv_buffer's token dimension: (k|v, token, layer, ...) for page_first
    MHA, (k|v, layer, token, ...) for layer_first MHA, (token, layer, ...)
    and (layer, token, ...) for MLA."""
    return list(host.kv_buffer.shape).index(host.size)


def fill(host, pages, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    d = _tok_dim(host)
    for p in pages:
        idx = tokens([p])
        shape = list(host.kv_buffer.shape)
        shape[d] = len(idx)
        host.kv_buffer.index_copy_(d, idx, torch.randn(shape, generator=g).to(host.kv_buffer.dtype))
        assert any(page_bytes(host, p)), "the filled page is zero"


def zero(host, pages) -> None:
    host.kv_buffer.index_fill_(_tok_dim(host), tokens(pages), 0)


@pytest.fixture
def backends():
    made = []
    yield made
    for b in made:
        b.close()


@pytest.mark.parametrize("pool", list(POOLS))
def test_round_trip(cluster, backends, pool):
    """Pages of each layout out and back into other pages, byte for byte;
    the dynamic factory made our class; each page is one object under a
    Conductor block key whose id is SGLang's own 64-bit page hash."""
    make, mla = POOLS[pool]
    host = make()
    b = attach(extra_json(cluster.master), host)
    backends.append(b)
    assert isinstance(b, MooncakeGoHiCache)
    keys = hashes(3)
    fill(host, [0, 1, 2], seed=1)
    assert b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys, tokens([0, 1, 2])) == [True] * 3
    assert b.batch_exists(keys) == 3
    zero(host, [10, 11, 12])
    assert b.batch_get_v1(keys, tokens([10, 11, 12])) == [True] * 3
    for src, dst in zip([0, 1, 2], [10, 11, 12]):
        assert page_bytes(host, dst) == page_bytes(host, src), f"page {src} came back different"
    assert page_bytes(host, 10) != page_bytes(host, 11)
    # Writing a page again is a success (keys name content; the store is write-once).
    assert b.batch_set_v1(keys[:1], tokens([0])) == [True]

    # The object, as another client sees it: one per page, the whole page.
    part = "mla" if mla else "tp0"
    lf = "-lf" if host.layout == "layer_first" else ""
    key = f"tiny@{part}{lf}@{hash_str_to_int64(keys[1]) & (2**64 - 1):016x}"
    assert key == page_key(b.prefix, keys[1])
    with Store(cluster.master, segment_size=-1) as raw:
        assert raw.get_size(key) == len(page_bytes(host, 1))
        if host.layout == "page_first" and not mla:
            kv = page_bytes(host, 1)  # (token, layer, head, dim) of K then of V
            assert raw.get(key) == kv


def test_missing_and_prefix_semantics(cluster, backends):
    """A page never written is a miss and its pool memory is left alone;
    exists counts from the first page and stops at the first one missing."""
    host = mha_pool()
    b = attach(extra_json(cluster.master), host)
    backends.append(b)
    keys = hashes(4)
    fill(host, [0, 1, 2, 3], seed=2)
    # Pages 0, 1 and 3 written, 2 not.
    assert b.batch_set_v1([keys[0], keys[1], keys[3]], tokens([0, 1, 3])) == [True] * 3
    assert b.batch_exists(keys) == 2
    assert b.batch_exists(keys[3:]) == 1
    assert b.batch_exists([keys[2]] + keys[:2]) == 0
    assert b.batch_exists([]) == 0
    assert b.exists(keys[0]) and not b.exists(keys[2])
    fill(host, [20, 21, 22, 23], seed=3)
    before = page_bytes(host, 22)
    assert b.batch_get_v1(keys, tokens([20, 21, 22, 23])) == [True, True, False, True]
    assert page_bytes(host, 22) == before, "a missing page wrote into the pool"
    assert page_bytes(host, 23) == page_bytes(host, 3)


def test_tp_ranks(cluster, backends):
    """MHA: two TP ranks write different heads under the same page hashes
    and each reads its own back (a rank's key carries its rank); the other
    rank's page is not a hit. MLA: ranks share one object, so rank 1 reads
    what rank 0 wrote."""
    keys = hashes(2)
    ranks = []
    for rank in (0, 1):
        host = mha_pool()
        b = attach(extra_json(cluster.master), host, tp_rank=rank, tp_size=2)
        backends.append(b)
        fill(host, [0, 1], seed=10 + rank)
        ranks.append((b, host))
    assert ranks[0][0].batch_set_v1(keys, tokens([0, 1])) == [True, True]
    # Rank 1 has written nothing: rank 0's pages are not its hits.
    assert ranks[1][0].batch_exists(keys) == 0
    assert ranks[1][0].batch_get_v1(keys, tokens([5, 6])) == [False, False]
    assert ranks[1][0].batch_set_v1(keys, tokens([0, 1])) == [True, True]
    for b, host in ranks:
        zero(host, [5, 6])
        assert b.batch_get_v1(keys, tokens([5, 6])) == [True, True]
        assert page_bytes(host, 5) == page_bytes(host, 0)
        assert page_bytes(host, 6) == page_bytes(host, 1)
    assert page_bytes(ranks[0][1], 5) != page_bytes(ranks[1][1], 5)

    mkeys = hashes(2)
    h0, h1 = mla_pool(), mla_pool()
    w = attach(extra_json(cluster.master), h0, tp_rank=0, tp_size=2)
    r = attach(extra_json(cluster.master), h1, tp_rank=1, tp_size=2)
    backends.extend([w, r])
    assert w.prefix == r.prefix
    fill(h0, [1, 2], seed=20)
    assert w.batch_set_v1(mkeys, tokens([1, 2])) == [True, True]
    assert r.batch_exists(mkeys) == 2
    assert r.batch_get_v1(mkeys, tokens([7, 8])) == [True, True]
    assert page_bytes(h1, 7) == page_bytes(h0, 1) and page_bytes(h1, 8) == page_bytes(h0, 2)


def test_corrupted_or_short_value_is_a_miss(cluster, backends, caplog):
    """Negative controls: a page whose stored bytes were changed after the
    put (one byte flipped in the replica, through the transfer engine, as a
    bad memory or a stray write would) fails its CRC and is a miss; so is a
    value of another length under the page's key (a pool of another
    shape), and a page under a wrong key."""
    host = mha_pool()
    b = attach(extra_json(cluster.master), host)
    backends.append(b)
    keys = hashes(3)
    fill(host, [0, 1, 2], seed=30)
    assert b.batch_set_v1(keys[:2], tokens([0, 1])) == [True, True]
    k0 = page_key(b.prefix, keys[0])

    with TransferEngine(host="127.0.0.1") as eng, Store(cluster.master, segment_size=-1) as raw:
        mem = [r for r in raw.replicas(k0) if r["kind"] == "memory"]
        assert len(mem) == 1, mem
        one = bytearray(1)
        eng.register_memory(one)
        seg = eng.open_segment(mem[0]["segment_name"])
        eng.read(seg, one, mem[0]["buffer_address"] + 100)
        one[0] ^= 0xFF
        eng.write(seg, one, mem[0]["buffer_address"] + 100)
        eng.unregister_memory(one)
        # The store itself now refuses the value: the flip landed.
        with pytest.raises(errors.StoreError) as bad:
            raw.get(k0)
        assert bad.value.code == CHECKSUM_MISMATCH, bad.value
        # A short value under the key of page 2 (half a page).
        raw.put(page_key(b.prefix, keys[2]), page_bytes(host, 2)[: len(page_bytes(host, 2)) // 2])

    fill(host, [20, 21, 22], seed=31)
    caplog.clear()
    assert b.batch_get_v1(keys, tokens([20, 21, 22])) == [False, True, False]
    # Reported, not only missed: the CRC failure is named.
    assert any("2 of 3 pages failed" in r.getMessage() and "CHECKSUM" in r.getMessage().upper()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert page_bytes(host, 21) == page_bytes(host, 1)  # the good page still reads
    # A wrong key (another model's prefix) is no hit for the good page.
    other = attach(extra_json(cluster.master), mha_pool(), model_name="org/other")
    backends.append(other)
    assert other.batch_exists(keys[1:2]) == 0
    assert other.batch_get_v1(keys[1:2], tokens([3])) == [False]


def test_store_restart(mooncake_bin, backends, caplog):
    """The store goes away mid-run: gets and exists report misses, sets
    report failures, nothing raises; once a store is back at the same
    address the same backend writes and reads again (the old pages went
    with the old store: no HA journal here)."""
    port = free_port()
    args = ("--no-ha", "--nodes", "1", "--global_segment_size", "64MiB", "--rpc_port", str(port))
    c = start_cluster(mooncake_bin, *args)
    try:
        host = mha_pool()
        b = attach(extra_json(c.master, rpc_timeout_ms=2000), host)
        backends.append(b)
        keys = hashes(2)
        fill(host, [0, 1], seed=40)
        assert b.batch_set_v1(keys, tokens([0, 1])) == [True, True]
        c.stop()
        caplog.clear()
        assert b.batch_exists(keys) == 0
        assert b.batch_get_v1(keys, tokens([4, 5])) == [False, False]
        assert b.batch_set_v1(keys, tokens([0, 1])) == [False, False]
        # Each failure is reported (a store away is no plain miss).
        logged = [r.getMessage() for r in caplog.records if r.name.startswith("mooncake_go.connectors.sglang")]
        for op in ("exists", "get", "put"):
            assert any(m.startswith(f"mooncake-go hicache: {op} ") for m in logged), (op, logged)
        c = start_cluster(mooncake_bin, *args)
        # The client reconnects on its own, at gRPC's reconnect pace (its
        # backoff grew while the master was away): wait for that, bounded.
        deadline = time.monotonic() + 60
        while b.batch_set_v1(keys, tokens([0, 1])) != [True, True]:
            assert time.monotonic() < deadline, "the backend did not work again within 60 s of the restart"
            time.sleep(0.2)
        assert b.batch_exists(keys) == 2
        zero(host, [4, 5])
        assert b.batch_get_v1(keys, tokens([4, 5])) == [True, True]
        assert page_bytes(host, 4) == page_bytes(host, 0)
    finally:
        c.stop()


def test_page_ids_match_sglang_events():
    """The key's id is SGLang's KV-event block hash of the page (as
    unsigned), so the Conductor indexes what SGLang announces; a key that is
    not a hash still gets a stable id."""
    for h in hashes(3):
        assert page_id64(h) == hash_str_to_int64(h) & (2**64 - 1)
    assert page_id64("not-a-hash") == page_id64("not-a-hash") != page_id64("not-a-hash2")


def test_controller_takes_the_zero_copy_path():
    """interface_v1 in the extra config is what makes SGLang's controller
    call batch_get_v1/batch_set_v1 on a dynamic backend; the README's line
    carries it. (A check on SGLang's own source, so an upgrade that drops
    the switch fails here.)"""
    import inspect

    assert '"interface_v1"' in inspect.getsource(HiCacheController.attach_storage_backend)


def test_copying_interface_reads_the_same_objects(cluster, backends):
    """Without interface_v1 SGLang moves pages as flat tensors (batch_set /
    batch_get of get_data_page / get_dummy_flat_data_page). Those objects
    are the zero-copy ones: a page written one way reads back the other."""
    host = mha_pool()
    b = attach(extra_json(cluster.master), host)
    backends.append(b)
    keys = hashes(2)
    fill(host, [0, 1], seed=50)
    assert b.batch_set_v1(keys[:1], tokens([0])) == [True]
    assert b.batch_set(keys[1:], [host.get_data_page(1 * PAGE, flat=True)])
    got = b.batch_get(keys + hashes(1))
    assert got[2] is None, "a page never written came back"
    for i in (0, 1):
        assert torch.equal(got[i], host.get_data_page(i * PAGE, flat=True)), f"page {i} differs"
    zero(host, [6])
    assert b.batch_get_v1(keys[1:], tokens([6])) == [True]
    assert page_bytes(host, 6) == page_bytes(host, 1)


@pytest.mark.parametrize("kw,want", [
    # MHA: each TP rank its own heads.
    (dict(mla=False, tp_rank=3), "tiny@tp3"),
    # MLA: one object for every TP rank.
    (dict(mla=True, tp_rank=3), "tiny@mla"),
    # Pipeline, context and decode-context ranks hold shards of their own.
    (dict(mla=False, tp_rank=1, pp_rank=2, pp_size=4), "tiny@tp1pp2"),
    (dict(mla=True, cp_rank=1, cp_size=2, dcp_rank=1, dcp_size=2), "tiny@mlacp1dcp1"),
    # layer_first pages order their bytes otherwise.
    (dict(mla=True, layer_first=True), "tiny@mla-lf"),
    (dict(mla=False, tenant="acme"), "acme/tiny@tp0"),
])
def test_key_prefix(kw, want):
    from mooncake_go.connectors.sglang import key_prefix

    assert key_prefix("org/tiny", **kw) == want


def test_local_hostname_from_the_environment(sglang_environ, backends):
    """SGLang's Mooncake setups name this host in MOONCAKE_LOCAL_HOSTNAME
    (sglang_env: 127.0.0.1); without a local_hostname in the extra config
    the backend's engine listens there, as SGLang's own backend does."""
    b = attach(extra_json(sglang_environ.master), mha_pool())
    backends.append(b)
    assert b.store.name.startswith("127.0.0.1:"), b.store.name


# -- a batch's arguments as flat arrays (connectors/sglang/flat.py) -------


class _OwnMeta(MHATokenToKVPoolHost):
    """A pool whose metadata is its own (a subclass that overrides it)."""

    def get_page_buffer_meta(self, indices):
        return super().get_page_buffer_meta(indices)


@pytest.mark.parametrize("pool", list(POOLS))
def test_pool_layout_matches_the_pools_metadata(pool):
    """The layout worked out once per pool gives, for any pages, the very
    addresses and sizes the pool's own get_page_buffer_meta gives: pages
    in any order, apart or together, int64 or int32 indices, one page or
    the whole pool."""
    from mooncake_go.connectors.sglang.flat import PoolLayout

    host = POOLS[pool][0]()
    layout = PoolLayout.of(host)
    assert layout is not None, f"{pool}: no layout"
    pages = host.size // PAGE
    g = torch.Generator().manual_seed(7)
    for sel in ([0], [pages - 1], [5, 1, 9], list(range(pages)), torch.randperm(pages, generator=g)[:7].tolist()):
        for dtype in (torch.int64, torch.int32):
            idx = tokens(sel).to(dtype)
            ptrs, sizes = host.get_page_buffer_meta(idx)
            got = layout.pieces(idx, len(sel))
            assert got is not None
            assert got[0].tolist() == ptrs and got[1].tolist() == sizes, f"{pool}: pages {sel} ({dtype})"
            assert layout.page_bytes * len(sel) == sum(sizes)
    assert layout.pieces(tokens([0, 1])[:-1], 2) is None, "indices that are not whole pages took the layout"


def test_a_pool_with_its_own_metadata_keeps_it(cluster, backends):
    """A pool class that overrides get_page_buffer_meta gets no layout:
    its batches go through its own metadata, and still round-trip."""
    from mooncake_go.connectors.sglang.flat import PoolLayout

    dev = MHATokenToKVPool(128, PAGE, torch.bfloat16, 2, 64, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)
    host = _OwnMeta(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, "page_first", pin_memory=False,
                    device="cpu", device_capacity_tokens=dev.size, start_layer=0, end_layer=LAYERS,
                    write_back_staging=dev.hicache_write_back_staging)
    assert PoolLayout.of(host) is None
    b = attach(extra_json(cluster.master), host)
    backends.append(b)
    keys = hashes(2)
    fill(host, [0, 1], seed=60)
    assert b.batch_set_v1(keys, tokens([0, 1])) == [True, True]
    zero(host, [4, 5])
    assert b.batch_get_v1(keys, tokens([4, 5])) == [True, True]
    assert page_bytes(host, 4) == page_bytes(host, 0) and page_bytes(host, 5) == page_bytes(host, 1)


@pytest.mark.parametrize("pool", list(POOLS))
def test_batches_take_no_metadata_per_batch(cluster, backends, pool):
    """Once registered, a pool's pages are placed from its layout: sets,
    existence checks and gets of every layout round-trip with the pool's
    get_page_buffer_meta made to fail, which the backend used to call, and
    walk page by page, on every batch."""
    host = POOLS[pool][0]()
    b = attach(extra_json(cluster.master), host)
    backends.append(b)

    def walked(indices):
        raise AssertionError("get_page_buffer_meta called for a batch")

    host.get_page_buffer_meta = walked
    keys = hashes(14)  # past flat.key_array's few, so keys are built in one piece too
    src, dst = list(range(14)), list(range(16, 30))
    fill(host, src, seed=70)
    assert b.batch_set_v1(keys, tokens(src)) == [True] * 14
    assert b.batch_exists(keys) == 14
    zero(host, dst)
    assert b.batch_get_v1(keys, tokens(dst)) == [True] * 14
    for s, d in zip(src, dst):
        assert page_bytes(host, d) == page_bytes(host, s), f"{pool}: page {s} came back different"
    # The store's uniform form refuses arrays that do not cover the batch.
    ptrs = np.zeros(3, dtype=np.uint64)
    with pytest.raises(ValueError):
        b.store._parts_uniform_codes(True, ["a", "b"], ptrs, ptrs, 2)


def test_read_after_exists_reuses_its_keys(cluster, backends, monkeypatch):
    """SGLang reads the pages an existence check just found: the read takes
    the check's key array (or its first keys) instead of building one;
    other keys are built."""
    from mooncake_go.connectors.sglang import backend as backend_mod

    host = mha_pool()
    b = attach(extra_json(cluster.master), host)
    backends.append(b)
    keys = hashes(13)
    fill(host, range(13), seed=80)
    assert b.batch_set_v1(keys, tokens(range(13))) == [True] * 13
    built = []
    real = backend_mod.key_array
    monkeypatch.setattr(backend_mod, "key_array", lambda prefix, ks: built.append(len(ks)) or real(prefix, ks))
    assert b.batch_exists(keys) == 13
    assert built == [13]
    zero(host, range(16, 29))
    assert b.batch_get_v1(keys, tokens(range(16, 29))) == [True] * 13
    assert b.batch_get_v1(keys[:3], tokens([16, 17, 18])) == [True] * 3
    assert built == [13], "the read built keys the existence check had built"
    for i in range(13):
        assert page_bytes(host, 16 + i) == page_bytes(host, i)
    assert b.batch_get_v1(keys[1:3], tokens([20, 21])) == [True, True]
    assert built == [13, 2]
    assert page_bytes(host, 20) == page_bytes(host, 1)


@pytest.mark.parametrize("n", [0, 1, 11, 12, 13, 64])
def test_key_array_is_page_key(n):
    """flat.key_array builds the keys page_key builds, one by one or in one
    piece: lower-cased hex ids, and a hashed id for keys that do not start
    with 16 hex digits (one such key among hex ones included)."""
    from mooncake_go.connectors.sglang.flat import key_array

    hs = [h.upper() if i % 3 == 0 else h for i, h in enumerate(hashes(n))] if n else []
    for ks in (hs, hs[:-1] + ["not-a-hash"] if n else [], hs[:-1] + ["0123456789abcdeZ" * 4] if n else []):
        got = [k.decode() for k in key_array("acme/tiny@tp0", ks)]
        assert got == [page_key("acme/tiny@tp0", k) for k in ks]
