"""Our HiCache backend's per-pool interface (v2: register_mem_host_pool_v2,
batch_exists_v2, batch_get_v2, batch_set_v2), which SGLang's hybrid cache
controller calls for the side pools of hybrid models (Mamba states here),
with real SGLang objects on CPU: its MHA host KV pool as the anchor, its
MambaPoolHost as the side pool, its PoolTransfer descriptors, against a
real ``mooncake up``. The hit policies are checked against SGLang's own
file backend (HiCacheFile) holding the same pages: both must find the same
restorable prefixes."""

from __future__ import annotations

import re

import pytest
import torch

from mooncake_go import Store
from mooncake_go.connectors.sglang import page_key
from mccluster import start_cluster
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import (HiCacheFile, HiCacheStorageConfig, PoolHitPolicy, PoolName,
                                                  PoolTransfer)
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from test_go_hicache_backend import attach, extra_json, fill, hashes, mha_pool, page_bytes, tokens

MAMBA_LAYERS, SLOTS = 2, 16


@pytest.fixture
def backends():
    made = []
    yield made
    for b in made:
        b.close()


def mamba_pool() -> MambaPoolHost:
    """A Mamba state pool (one temporal state and one conv state per layer
    and slot; page_first, as SGLang's zero-copy storage path needs)."""
    info = MambaStateBufferInfo(temporal=torch.zeros(MAMBA_LAYERS, SLOTS, 4, 8, dtype=torch.float32),
                                conv=(torch.zeros(MAMBA_LAYERS, SLOTS, 16, 3, dtype=torch.bfloat16),))
    return MambaPoolHost(info, 2.0, 0, device_capacity=SLOTS, pin_memory=False, device="cpu", layout="page_first")


def state(pool: MambaPoolHost, slot: int) -> bytes:
    return pool.get_data_page(slot).numpy().tobytes()


def fill_states(pool: MambaPoolHost, slots, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for s in slots:
        for buf in pool.get_hybrid_pool_buffer():
            buf[s].copy_(torch.randn(buf[s].shape, generator=g).to(buf.dtype))
        assert any(state(pool, s))


def mamba(slots, keys, policy=PoolHitPolicy.TRAILING_PAGES) -> PoolTransfer:
    return PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor(slots, dtype=torch.int64), keys=list(keys),
                        hit_policy=policy)


def hybrid(cluster, backends, **kw):
    kv, side = mha_pool(), mamba_pool()
    b = attach(extra_json(cluster.master, **kw), kv)
    b.register_mem_host_pool_v2(side, PoolName.MAMBA)
    b.on_host_pools_registered()
    backends.append(b)
    return b, kv, side


def test_side_pool_round_trip(cluster, backends):
    """KV pages through v1, Mamba states of the same pages through v2, out
    and back into other slots byte for byte; each state is one object of
    its own, under the KV page's key and the pool's name, which the
    Conductor's feed does not read as a block."""
    b, kv, side = hybrid(cluster, backends)
    keys = hashes(3)
    fill(kv, [0, 1, 2], seed=5)
    fill_states(side, [1, 2, 3], seed=6)
    assert b.batch_set_v1(keys, tokens([0, 1, 2])) == [True] * 3
    assert b.batch_set_v2([mamba([1, 2, 3], keys)]) == {PoolName.MAMBA: [True] * 3}
    # Writing again succeeds (write-once store, keys name content).
    assert b.batch_set_v2([mamba([1], keys[:1])]) == {PoolName.MAMBA: [True]}

    got = b.batch_get_v2([mamba([9, 10, 11], keys)])
    assert got == {PoolName.MAMBA: [True] * 3}
    for src, dst in zip([1, 2, 3], [9, 10, 11]):
        assert state(side, dst) == state(side, src), f"state of slot {src} came back different"
    assert state(side, 9) != state(side, 10)

    key = b._component_key(PoolName.MAMBA, keys[1])
    assert key == page_key(b.prefix, keys[1]) + ".mamba"
    assert not re.fullmatch("[0-9a-f]{16}", key.rsplit("@", 1)[1]), "the feed would read the state as a block"
    with Store(cluster.master, segment_size=-1) as raw:
        assert raw.get(key) == state(side, 2), "the object is not the slot's state"

    # The KV pages and the states were moved by separate calls into separate pools.
    assert b.batch_get_v1(keys, tokens([20, 21, 22])) == [True] * 3
    assert page_bytes(kv, 21) == page_bytes(kv, 1)


def test_missing_side_pages_and_bad_transfers(cluster, backends):
    """A state never written is a miss and leaves its slot alone; a
    transfer whose indices do not cover its keys, or of a pool never
    registered, fails (all False) without failing the other pools'."""
    b, kv, side = hybrid(cluster, backends)
    keys = hashes(3)
    fill_states(side, [0, 1, 2, 5, 6, 7], seed=7)
    assert b.batch_set_v2([mamba([0, 2], [keys[0], keys[2]])]) == {PoolName.MAMBA: [True, True]}
    before = state(side, 6)
    assert b.batch_get_v2([mamba([5, 6, 7], keys)]) == {PoolName.MAMBA: [True, False, True]}
    assert state(side, 6) == before, "a missing state wrote into the pool"
    assert state(side, 7) == state(side, 2)

    short = mamba([5], keys[:2])  # one slot for two pages
    assert b.batch_get_v2([short]) == {PoolName.MAMBA: [False, False]}
    assert b.batch_set_v2([short]) == {PoolName.MAMBA: [False, False]}
    swa = PoolTransfer(name=PoolName.SWA, host_indices=torch.tensor([0]), keys=keys[:1])
    assert b.batch_get_v2([swa, mamba([8], keys[:1])]) == {PoolName.SWA: [False], PoolName.MAMBA: [True]}
    assert state(side, 8) == state(side, 0)


# Presence patterns: which KV pages and which states the store holds, the
# Mamba transfer's window (len(keys)) and policy, and what both backends
# must answer: (usable pages, hit counts, restorable prefix lengths).
T, A = PoolHitPolicy.TRAILING_PAGES, PoolHitPolicy.ALL_PAGES
KV, MB = PoolName.KV, PoolName.MAMBA
PATTERNS = {
    "all-present": ([0, 1, 2, 3], [0, 1, 2, 3], 1, T, (4, {KV: 4, MB: 4}, [1, 2, 3, 4])),
    "trailing-holes": ([0, 1, 2, 3], [0, 2], 1, T, (3, {KV: 4, MB: 3}, [1, 3])),
    "trailing-window-2": ([0, 1, 2, 3], [0, 1, 3], 2, T, (2, {KV: 4, MB: 2}, [1, 2])),
    "kv-stops-early": ([0, 1, 3], [0, 1, 2, 3], 1, T, (2, {KV: 2, MB: 2}, [1, 2])),
    "all-pages": ([0, 1, 2, 3], [0, 1, 3], 1, A, (2, {KV: 4, MB: 2}, [1, 2])),
    "no-states": ([0, 1, 2], [], 1, T, (0, {KV: 3}, [])),
    "no-kv": ([], [0, 1], 1, A, (0, {}, [])),
}


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_hit_policies_match_sglangs_file_backend(cluster, backends, tmp_path, pattern):
    """batch_exists_v2 finds the same usable prefix, per-pool hit counts
    and set of restorable prefix lengths as SGLang's HiCacheFile over the
    same pages: its semantics, from its own code, are the yardstick."""
    kv_pages, states, window, policy, want = PATTERNS[pattern]
    b, kv, side = hybrid(cluster, backends)
    f = HiCacheFile(HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name="org/tiny"), file_path=str(tmp_path))
    f.register_mem_pool_host(kv)
    f.register_mem_host_pool_v2(side, PoolName.MAMBA)
    keys = hashes(4)
    fill(kv, [0, 1, 2, 3], seed=8)
    fill_states(side, [0, 1, 2, 3], seed=9)
    if kv_pages:
        ks = [keys[i] for i in kv_pages]
        assert b.batch_set_v1(ks, tokens(kv_pages)) == [True] * len(ks)
        assert f.batch_set(ks, [kv.get_data_page(i * kv.page_size) for i in kv_pages])
    if states:
        t = mamba(states, [keys[i] for i in states])
        assert b.batch_set_v2([t]) == {PoolName.MAMBA: [True] * len(states)}
        assert f.batch_set_v2([t]) == {PoolName.MAMBA: [True] * len(states)}

    query = [mamba([0] * window, keys[4 - window:], policy)]
    ours, theirs = b.batch_exists_v2(keys, query), f.batch_exists_v2(keys, query)
    for r in (ours, theirs):
        assert (r.kv_hit_pages, r.extra_pool_hit_pages, r.restorable_prefix_pages) == want, r
    # Without side pools, the usable prefix is the KV run of batch_exists.
    assert b.batch_exists_v2(keys, []).kv_hit_pages == b.batch_exists(keys)


def test_unsupported_hit_policy_is_refused(cluster, backends):
    b, _, _ = hybrid(cluster, backends)
    t = PoolTransfer(name=PoolName.MAMBA, keys=hashes(1), hit_policy=PoolHitPolicy.BLOCK_GROUPS)
    with pytest.raises(ValueError, match="hit policy"):
        b.batch_exists_v2(hashes(2), [t])


def test_store_unreachable_is_a_miss(mooncake_bin, backends, caplog):
    """Against a store that went away, exists finds nothing and gets and
    sets report failures per pool, with no exception."""
    c = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "64MiB")
    try:
        b, kv, side = hybrid(c, backends, rpc_timeout_ms=2000)
        keys = hashes(2)
        fill_states(side, [0, 1], seed=10)
        assert b.batch_set_v1(keys, tokens([0, 1])) == [True, True]
        assert b.batch_set_v2([mamba([0, 1], keys)]) == {PoolName.MAMBA: [True, True]}
    finally:
        c.stop()
    r = b.batch_exists_v2(keys, [mamba([0], keys[1:])])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages, r.restorable_prefix_pages) == (0, {}, [])
    assert b.batch_get_v2([mamba([2, 3], keys)]) == {PoolName.MAMBA: [False, False]}
    assert b.batch_set_v2([mamba([0, 1], keys)]) == {PoolName.MAMBA: [False, False]}
