"""MooncakeGoHiCache: SGLang's HiCache storage tier (L3) on a mooncake-go
store, loaded by SGLang's ``dynamic`` backend factory.

SGLang hands the backend pages of its host KV pool: page hashes and the
pool's token indices. Each page becomes one store object, read and written
in place: the pool's buffer is registered with the store once, and a batch
goes out as the addresses of its pages' pieces (K and V of a page_first MHA
page, one piece per layer of a layer_first pool), which the store gathers
into one value on put and scatters back on get (batch_put_from_parts /
batch_get_into_parts), with no copy in this process: one object per page
where SGLang's own backend writes K and V apart. A put needs no existence
check first, the store being write-once, and an existence check primes
the read that follows it (batch_exists). A batch's arguments are built as
flat arrays with no Python work per page (flat.py): where a pool keeps its
pages is worked out once per pool, the keys of a batch are one C array,
and those of an existence check are the ones its read reuses.

A read is a hit only if the whole page came back: the store checks each
value's CRC-32C, and a value of another length than the page (written by
a pool of another shape) fills less than the page; both are misses, so
SGLang recomputes rather than serve bad KV. A store that cannot be reached
makes every page a miss (gets, exists) or a failed write (sets), logged,
and the calls work again once it is back.

Hybrid models' side pools (Mamba states, sliding-window KV, indexers)
come through SGLang's v2 calls (register_mem_host_pool_v2,
batch_exists_v2, batch_get_v2, batch_set_v2) and are stored the same way:
one object per pool and page, under the KV page's key and the pool's name.

Keys: keys.py.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from mooncake_go import Store, errors
from mooncake_go import parse_size
from mooncake_go.store import _code_error
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo,
                                                  PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

from .flat import PoolLayout, key_array
from .keys import key_prefix, page_key

log = logging.getLogger(__name__)

_ALREADY_EXISTS = -705  # MC_STORE_ERR_OBJECT_ALREADY_EXISTS: the page is there
_NOT_FOUND = -704  # MC_STORE_ERR_OBJECT_NOT_FOUND: a plain miss


def _report(op: str, keys: List[str], codes: List[int], ok: List[bool], quiet) -> None:
    """Logs a batch's failed pages, one line: how many, and the first one's
    status (a short read has status 0). Plain misses (quiet) are not failures."""
    bad = [i for i, good in enumerate(ok) if not good and codes[i] not in quiet]
    if bad:
        i = bad[0]
        what = _code_error(codes[i]) if codes[i] else "short value (another page shape)"
        log.warning("mooncake-go hicache: %s of %d of %d pages failed; page %s: %s",
                    op, len(bad), len(keys), keys[i], what)


# Pool tensors that may hold page bytes (kv_buffer: one tensor for K and V
# or the latent; the others: layouts that keep them apart).
_POOL_TENSORS = ("kv_buffer", "k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer")


def _pool_tensors(pool) -> list:
    """The tensors of a host pool that pages lie in: the pool's own list
    of them where it has one (get_hybrid_pool_buffer: Mamba states, DSA
    indexers, K/V pools), and the usual buffer attributes."""
    out = [getattr(pool, name, None) for name in _POOL_TENSORS]
    listed = getattr(pool, "get_hybrid_pool_buffer", None)
    if callable(listed):
        out.extend(listed())
    return out


def _size(v: Any, name: str) -> int:
    """Bytes from an int or "64MB"/"1GB"/"512KiB" (every unit 1024-based, as
    Mooncake reads them: mooncake_go's one parser)."""
    try:
        return parse_size(v)
    except ValueError as e:
        raise ValueError(f"mooncake-go hicache: {name}: {e}") from e


def _page_lengths(sizes: List[int], counts: List[int]) -> List[int]:
    """Each page's length: the sum of its counts[i] piece sizes."""
    per = counts[0] if counts else 0
    if per and counts.count(per) == len(counts) and sizes == sizes[:per] * len(counts):
        return [sum(sizes[:per])] * len(counts)  # a pool's pages are alike: no per-page sums
    out, at = [], 0
    for c in counts:
        out.append(sum(sizes[at:at + c]))
        at += c
    return out


class Settings:
    """The backend's keys of --hicache-storage-backend-extra-config.

    master: the store master "host:port" or "etcd://..." [env MOONCAKE_MASTER].
    segment_size (or global_segment_size): memory this process lends the
        store pool [0: none; pages then live on the pool's storage nodes,
        e.g. `mooncake up`'s, and outlive this process].
    local_buffer_size: staging for unregistered memory [16 MiB; pages
        never use it].
    protocol: the store's transfer engine [library default].
    local_hostname: the address the engine listens on [env
        MOONCAKE_LOCAL_HOSTNAME, which SGLang's Mooncake setups set, or the
        library's choice: the first non-loopback IPv4].
    replicas: memory replicas per page [1].
    rpc_timeout_ms: per call to the master [the library's 30 s]; a store
        that went away costs each batch up to this long.
    tenant, key_prefix: keys.key_prefix.
    """

    def __init__(self, extra: Optional[dict]):
        extra = dict(extra or {})
        self.master = extra.get("master") or extra.get("master_server_address") or os.environ.get("MOONCAKE_MASTER")
        if not self.master:
            raise ValueError("mooncake-go hicache: no store master: set \"master\" in "
                             "--hicache-storage-backend-extra-config (or MOONCAKE_MASTER)")
        seg = extra.get("segment_size", extra.get("global_segment_size", 0))
        self.segment_size = _size(seg, "segment_size")
        self.local_buffer_size = _size(extra.get("local_buffer_size", 16 << 20), "local_buffer_size")
        self.protocol = extra.get("protocol")
        self.local_hostname = extra.get("local_hostname") or os.environ.get("MOONCAKE_LOCAL_HOSTNAME")
        self.replicas = int(extra.get("replicas", 0))
        self.rpc_timeout_ms = int(extra.get("rpc_timeout_ms", 0))
        self.tenant = extra.get("tenant")
        self.key_prefix = extra.get("key_prefix")


class MooncakeGoHiCache(HiCacheStorage):
    """SGLang HiCache storage on mooncake-go (module doc). SGLang builds it
    as ``class(storage_config, kwargs)`` and then registers its host pool."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.config = storage_config
        self.settings = Settings(storage_config.extra_config)
        s = self.settings
        # segment_size 0 here means none; the store reads 0 as its default.
        self.store = Store(s.master, segment_size=s.segment_size or -1, local_buffer_size=s.local_buffer_size,
                           protocol=s.protocol, local_hostname=s.local_hostname, replicas=s.replicas,
                           rpc_timeout_ms=s.rpc_timeout_ms)
        self.mem_pool_host = None
        self.prefix = ""
        self._prefixes: set = set()  # of every pool's keys, for clear
        self._registered: List[torch.Tensor] = []
        self._spans: List[tuple] = []  # (start, end) of the registered memory
        self._pool_prefix: Dict[Any, str] = {}  # v2 pools: name -> key prefix
        self._layouts: Dict[int, Optional[PoolLayout]] = {}  # id(pool) -> where its pages lie (flat.py)
        # The page hashes of the last existence check and their key array,
        # which the read that follows it takes instead of building its own.
        self._asked: tuple = ((), None)

    # -- the host pool ---------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Registers the pool's memory with the store, once, and fixes the
        key prefix (which depends on the pool's layout)."""
        super().register_mem_pool_host(mem_pool_host)
        self.prefix = self._prefix_of(mem_pool_host, mla=self.config.is_mla_model)
        self._layouts[id(mem_pool_host)] = PoolLayout.of(mem_pool_host)
        if not self._register(_pool_tensors(mem_pool_host)):
            raise ValueError(f"mooncake-go hicache: {type(mem_pool_host).__name__} has no KV buffer to register")

    def _prefix_of(self, pool, *, mla: bool) -> str:
        c = self.config
        prefix = key_prefix(c.model_name, mla=mla, tp_rank=c.tp_rank, pp_rank=c.pp_rank, pp_size=c.pp_size,
                            cp_rank=c.attn_cp_rank, cp_size=c.attn_cp_size, dcp_rank=c.dcp_rank,
                            dcp_size=c.dcp_size, layer_first=getattr(pool, "layout", None) == "layer_first",
                            tenant=self.settings.tenant, name=self.settings.key_prefix)
        self._prefixes.add(prefix)
        return prefix

    def _register(self, tensors) -> bool:
        """Registers every tensor not inside memory registered already;
        whether any tensor was given."""
        given = False
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            given = True
            lo = t.data_ptr()
            hi = lo + t.numel() * t.element_size()
            if any(a <= lo and hi <= b for a, b in self._spans):
                continue  # a view into memory already registered
            self.store.register_buffer(t)
            self._registered.append(t)
            self._spans.append((lo, hi))
        return given

    def _pieces(self, n: int, host_indices: torch.Tensor, pool=None):
        """(piece addresses, piece sizes, pieces per page, page lengths) of
        n pages at host_indices of the KV pool (or of pool): every page's
        pieces in order, as 64-bit numpy arrays for
        Store._parts_uniform_codes. From the pool's layout where flat.py
        worked it out (no work per page), else from the pool's own
        zero-copy metadata. Page lengths: one int where the pool's pages
        are alike, else a list."""
        pool = pool or self.mem_pool_host
        if pool is None:
            raise RuntimeError("mooncake-go hicache: register_mem_pool_host was not called")
        layout = self._layouts.get(id(pool))
        got = layout.pieces(host_indices, n) if layout is not None and n else None
        if got is not None:
            return got[0], got[1], layout.per, layout.page_bytes
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if n == 0 or len(ptrs) % n or len(sizes) != len(ptrs):
            raise ValueError(f"mooncake-go hicache: {len(ptrs)} page pieces for {n} pages")
        per = len(ptrs) // n
        ptrs, sizes = np.asarray(ptrs, dtype=np.uint64), np.asarray(sizes, dtype=np.uint64)
        return ptrs, sizes, per, sizes.reshape(n, per).sum(axis=1).tolist()

    def _key_array(self, keys: List[str]):
        """The KV pages' store keys as one C array (flat.key_array): the last
        existence check's where keys are its first pages (SGLang reads what
        it just found), else built."""
        asked, arr = self._asked  # one read: other threads replace it whole
        n = len(keys)
        if arr is not None and n <= len(asked) and keys == asked[:n]:
            return arr if n == len(arr) else (ctypes.c_char_p * n).from_buffer(arr)
        return key_array(self.prefix, keys)

    # -- hybrid models: SGLang's per-pool interface (v2) -----------------
    # A hybrid model's host memory is a group of pools: the KV pool, which
    # the v1 calls move, and side pools (Mamba states, sliding-window KV,
    # indexers, a draft model's KV) that SGLang moves with the v2 calls,
    # each named by a PoolName. A side pool's page is one object too, the
    # concatenation of its pieces, under the KV page's key and the pool's
    # name (_component_key).

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """Registers a side pool's memory with the store, once, and fixes
        the prefix of its keys: shared by the TP ranks of an MLA model
        (as its KV is) unless the pool holds per-rank state (Mamba states,
        an MHA pool's heads)."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        if self.mem_pool_host is None:
            raise RuntimeError("mooncake-go hicache: register_mem_pool_host was not called")
        per_rank = str(host_pool_name) == str(PoolName.MAMBA) or isinstance(host_pool, MHATokenToKVPoolHost)
        shared = self.config.is_mla_model and not per_rank
        self._pool_prefix[str(host_pool_name)] = self._prefix_of(host_pool, mla=shared)
        if host_pool is not self.mem_pool_host:
            self._register(_pool_tensors(host_pool))
            self._layouts[id(host_pool)] = PoolLayout.of(host_pool)

    def _component_key(self, name, page_hash: str) -> str:
        """The key of a side pool's page: ``<prefix>@<id>.<pool>``, whose
        last '@' field is not a block id, so the Conductor's store feed
        does not take a side pool's page for the KV of its block. The KV
        pool's name gives the KV page's own key."""
        name = str(name)
        if name == str(PoolName.KV):
            return page_key(self.prefix, page_hash)
        prefix = self._pool_prefix.get(name)
        if prefix is None:
            raise ValueError(f"mooncake-go hicache: pool {name!r} was not registered (register_mem_host_pool_v2)")
        return f"{page_key(prefix, page_hash)}.{name}"

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        """The longest prefix of keys whose KV pages, and the side pools'
        pages each pool's hit policy asks for, the store holds.

        KV: the leading run of pages present (as batch_exists). Then each
        pool keeps the prefix lengths it can restore: ALL_PAGES, those
        whose every page the pool holds; TRAILING_PAGES, those whose last
        len(transfer.keys) pages (at least one) it holds, which need not
        be a run. The result is the longest length every pool keeps, with
        each pool's own longest as its hit count and the whole set of
        lengths kept (the caller intersects it across ranks). One get
        session answers for every page of every pool (one master round
        trip), and leases them for the reads that follow."""
        transfers = list(pool_transfers or [])
        if not keys:
            return PoolTransferResult(0, {}, [])
        for t in transfers:
            if t.hit_policy not in (PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES):
                raise ValueError(f"mooncake-go hicache: pool {t.name}: hit policy {t.hit_policy} is not supported")
        n = len(keys)
        skeys = [page_key(self.prefix, k) for k in keys]
        for t in transfers:
            skeys.extend(self._component_key(t.name, k) for k in keys)
        try:
            res = self.store.get_session_start(skeys)
        except errors.MooncakeError as e:
            log.warning("mooncake-go hicache: exists of %d pages of %d pools failed: %s", n, len(transfers) + 1, e)
            return PoolTransferResult(0, {}, [])
        for k, r in zip(skeys, res):
            if r is not None and not isinstance(r, errors.ObjectNotFound):
                log.warning("mooncake-go hicache: exists of %s failed: %s", k, r)
                break
        held = [r is None for r in res]
        kv = held[:n].index(False) if False in held[:n] else n
        hits = {PoolName.KV: kv} if kv else {}
        keep = set(range(1, kv + 1))
        for j, t in enumerate(transfers):
            if not keep:
                break
            has = held[(j + 1) * n:(j + 2) * n]
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                run = has[:kv].index(False) if False in has[:kv] else kv
                ok = set(range(1, run + 1))
            else:
                w = max(1, len(t.keys or ()))
                ok = {m for m in range(1, kv + 1) if all(has[max(0, m - w):m])}
            if ok:
                hits[t.name] = max(ok)
            keep &= ok
        kept = sorted(keep)
        return PoolTransferResult(kept[-1] if kept else 0, hits, kept)

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        """Reads each transfer's pages (transfer.keys) into its pool at
        transfer.host_indices; per pool, True per page read whole and
        intact. Every pool's pages go in one store call."""
        return self._io_v2(True, transfers)

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        """Writes each transfer's pages from its pool; per pool, True per
        page the store holds afterwards. One store call for all pools."""
        return self._io_v2(False, transfers)

    def _io_v2(self, get: bool, transfers: List[PoolTransfer]) -> Dict[Any, List[bool]]:
        out: Dict[Any, List[bool]] = {}
        spans, skeys, ptrs, sizes, counts = [], [], [], [], []
        for t in transfers:
            keys = list(t.keys or [])
            out[t.name] = [False] * len(keys)
            if not keys:
                continue
            pool = getattr(self, "registered_pools", {}).get(t.name)
            if pool is None and str(t.name) == str(PoolName.KV):
                pool = self.mem_pool_host
            page = getattr(pool, "page_size", 1) or 1
            if pool is None or t.host_indices is None or t.host_indices.numel() != len(keys) * page:
                log.warning("mooncake-go hicache: pool %s: %s", t.name, "not registered" if pool is None else
                            f"{0 if t.host_indices is None else t.host_indices.numel()} host indices for "
                            f"{len(keys)} pages of {page}")
                continue
            p, n, per, _ = self._pieces(len(keys), t.host_indices, pool)
            spans.append((t.name, len(skeys), len(keys)))
            skeys += [self._component_key(t.name, k) for k in keys]
            ptrs += p.tolist()
            sizes += n.tolist()
            counts += [per] * len(keys)
        if not skeys:
            return out
        try:
            codes, got = self.store._parts_flat_codes(get, skeys, ptrs, sizes, counts)
        except errors.MooncakeError as e:
            log.warning("mooncake-go hicache: %s of %d pages failed: %s", "get" if get else "put", len(skeys), e)
            return out
        if get:
            ok = [c == 0 and g == w for c, g, w in zip(codes, got, _page_lengths(sizes, counts))]
        else:
            ok = [c in (0, _ALREADY_EXISTS) for c in codes]
        _report("get" if get else "put", skeys, codes, ok, (_NOT_FOUND,) if get else ())
        for name, at, m in spans:
            out[name] = ok[at:at + m]
        return out

    # -- the zero-copy interface SGLang calls (interface_v1) -------------

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Reads pages into the pool at host_indices; True per page read
        whole and intact."""
        if not keys:
            return []
        n = len(keys)
        ptrs, sizes, per, want = self._pieces(n, host_indices)
        try:
            # Store's raw-code form of batch_get_into_parts, on flat arrays:
            # nothing converted per page or piece in Python.
            cs, got = self.store._parts_uniform_codes(True, self._key_array(keys), ptrs, sizes, per)
        except errors.MooncakeError as e:
            log.warning("mooncake-go hicache: get of %d pages failed: %s", n, e)
            return [False] * n
        codes, lens = cs[:], got[:]
        if isinstance(want, int):
            if not any(codes) and lens.count(want) == n:
                return [True] * n  # the usual answer, without a step per page
            want = [want] * n
        ok = [c == 0 and g == w for c, g, w in zip(codes, lens, want)]
        _report("get", keys, codes, ok, (_NOT_FOUND,))
        return ok

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Writes pages from the pool at host_indices; True per page the
        store holds afterwards (a page already there counts: keys name
        their content)."""
        if not keys:
            return []
        n = len(keys)
        ptrs, sizes, per, _ = self._pieces(n, host_indices)
        try:  # batch_put_from_parts, raw
            cs, got = self.store._parts_uniform_codes(False, key_array(self.prefix, keys), ptrs, sizes, per)
        except errors.MooncakeError as e:
            log.warning("mooncake-go hicache: put of %d pages failed: %s", n, e)
            return [False] * n
        codes = cs[:]
        if not any(codes):
            return [True] * n
        ok = [c in (0, _ALREADY_EXISTS) for c in codes]
        _report("put", keys, codes, ok, ())
        return ok

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many of keys, from the first, the store holds (SGLang's
        prefix semantics: counting stops at the first page missing).

        SGLang asks this right before it reads the pages it found, so the
        question goes as a get session: one master round trip that answers
        it and also leases the replicas, which the read that follows then
        uses without asking the master again (the lease keeps the pages
        from eviction meanwhile; an unused one lapses on its own)."""
        if not keys:
            return 0
        arr = key_array(self.prefix, keys)
        try:
            codes = self.store._session_start_codes(arr)
        except errors.MooncakeError as e:
            log.warning("mooncake-go hicache: exists of %d pages failed: %s", len(keys), e)
            return 0
        self._asked = (list(keys), arr)
        if not any(codes):
            return len(keys)
        i = next(i for i, c in enumerate(codes) if c)
        if codes[i] != _NOT_FOUND:
            log.warning("mooncake-go hicache: exists of page %s failed: %s", keys[i], _code_error(codes[i]))
        return i

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- the copying interface (SGLang's generic path) -------------------
    # SGLang takes these only without interface_v1; pages then travel as
    # flat tensors, copied into and out of the pool by SGLang.

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        out = self.batch_get([key], [target_location] if target_location is not None else None)
        return out[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        """Flat pages into target_locations (tensors of one page each, as
        get_dummy_flat_data_page makes them); None per page missed."""
        if target_locations is None:
            target_locations = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        skeys = [page_key(self.prefix, k) for k in keys]
        try:
            got = self.store.batch_get_into(skeys, [t.view(torch.uint8).view(-1) for t in target_locations])
        except errors.MooncakeError as e:
            log.warning("mooncake-go hicache: get of %d pages failed: %s", len(keys), e)
            return [None] * len(keys)
        return [t if isinstance(g, int) and g == t.numel() * t.element_size() else None
                for g, t in zip(got, target_locations)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Flat pages (tensors) under keys; True if the store holds all."""
        skeys = [page_key(self.prefix, k) for k in keys]
        try:
            res = self.store.batch_put(skeys, [v.contiguous().view(torch.uint8).view(-1) for v in values])
        except errors.MooncakeError as e:
            log.warning("mooncake-go hicache: put of %d pages failed: %s", len(keys), e)
            return False
        return all(r is None or isinstance(r, errors.ObjectAlreadyExists) for r in res)

    # -- lifecycle -------------------------------------------------------

    def clear(self) -> None:
        """Removes this backend's pages (its prefixes, v2 pools' too) from
        the store."""
        for p in sorted(self._prefixes):
            self.store.remove_by_regex("^" + re.escape(p + "@"))

    def close(self) -> None:
        """Leaves the store; the pool's memory is unregistered with it.
        Idempotent (SGLang calls it on detach)."""
        self.store.close()
        self._registered.clear()
        self._spans.clear()
