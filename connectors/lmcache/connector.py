"""LMCache's remote connector over mooncake_go.Store, and the adapter
LMCache's remote_storage_plugins mechanism loads.

A chunk is stored as its KV bytes only, under LMCache's key string
(``CacheEngineKey.to_string()``): shapes and dtypes are the engine's, so
there is nothing else to store, and a partial last chunk is told by its
length. LMCache's CPU pool is one pinned buffer; it is registered with the
store once, so puts read the chunks from it and gets write into it without
a copy. A memory object outside that buffer (an allocator that does not
expose one) gets its tensor's whole storage registered, once per storage.

Every store call runs in a worker thread (the library releases the GIL)
and holds a reference on the memory objects it reads or writes until it
returns, so an LMCache timeout that cancels the coroutine never frees a
buffer the store is still using.
"""

from __future__ import annotations

import asyncio
import threading
from typing import List, Optional, Sequence, Tuple

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext, extract_plugin_type
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from mooncake_go import MooncakeError, Replicate, Store
from mooncake_go.errors import ObjectAlreadyExists, ObjectNotFound

from .config import PLUGIN_TYPE, Settings
from .link import StoreLink, logger

PING_KEY = "__mooncake_go_lmcache_ping__"


class StoreUnavailable(ConnectionError):
    """The store failed recently; the plugin leaves it alone for a while."""


class PutFailed(RuntimeError):
    """Some chunks of a put were not stored."""


class MooncakeGoAdapter(ConnectorAdapter):
    """What ``extra_config["remote_storage_plugin.<name>.class_name"]``
    names: claims ``plugin://mooncake_go`` (and ``mooncake_go.<instance>``)
    and makes a :class:`MooncakeGoConnector` with that instance's settings."""

    def __init__(self) -> None:
        super().__init__("plugin://" + PLUGIN_TYPE)

    def can_parse(self, url: str) -> bool:
        return url.startswith("plugin://") and extract_plugin_type(url[len("plugin://"):]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        name = context.plugin_name or context.url[len("plugin://"):]
        settings = Settings.from_extra_config(context.config.extra_config if context.config else None, name)
        return MooncakeGoConnector(context.loop, context.local_cpu_backend, settings)


class MooncakeGoConnector(RemoteConnector):
    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend, settings: Settings):
        config, metadata = local_cpu_backend.config, local_cpu_backend.metadata
        super().__init__(config, metadata)
        # Chunks are stored as raw KV of the engine's full-chunk shape: a
        # layerwise layout or a compressing serde would need a header.
        if config.use_layerwise:
            raise ValueError("mooncake-go lmcache plugin: use_layerwise is not supported")
        if (config.remote_serde or "naive") != "naive":
            raise ValueError(f"mooncake-go lmcache plugin: remote_serde must be naive, not {config.remote_serde!r}")
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.settings = settings
        self.replicate = Replicate(replicas=settings.replicas, prefer_local=settings.prefer_local)
        self._regions_lock = threading.Lock()
        self._regions: List[Tuple[int, int]] = []  # (address, length) registered with every client
        pool = pool_buffer(local_cpu_backend.memory_allocator)
        if pool is not None:
            self._regions.append(pool)
        else:
            logger.info("mooncake-go lmcache plugin: LMCache's allocator exposes no contiguous buffer; "
                        "registering each memory object's storage on first use")
        self._fixed = len(self._regions)  # regions never unregistered: the pool
        self._link = StoreLink(settings, on_new=self._register_all)
        # Fails here (and LMCache reports the plugin unavailable) when the
        # master cannot be reached at start: a wrong address shows at once.
        self._link.open()
        logger.info("mooncake-go lmcache plugin: store %s, %d pool region(s) registered",
                    settings.master, len(self._regions))

    # -- memory registration ---------------------------------------------

    @property
    def registered_regions(self) -> List[Tuple[int, int]]:
        with self._regions_lock:
            return list(self._regions)

    def _register_all(self, store: Store) -> None:
        for addr, n in self.registered_regions:
            store.register_buffer(addr, n)

    def _cover(self, store: Store, objs: Sequence[MemoryObj], addrs: Sequence[int], sizes: Sequence[int]) -> None:
        """Registers the tensor storage of every object (at addrs, of sizes)
        outside the registered regions (with this client; a later client
        gets them from _register_all). A registered storage that overlaps a
        new one was freed (live storages never overlap), so it is
        unregistered first. The usual batch lies in LMCache's pool, one
        region: one check for all."""
        lo, hi = min(addrs), max(p + n for p, n in zip(addrs, sizes))
        with self._regions_lock:
            if any(a <= lo and hi <= a + m for a, m in self._regions):
                return
            for o, p, n in zip(objs, addrs, sizes):
                if any(a <= p and p + n <= a + m for a, m in self._regions):
                    continue
                raw = getattr(o, "raw_data", None)
                if raw is None or not hasattr(raw, "untyped_storage"):
                    raise ValueError(f"mooncake-go lmcache plugin: memory object at {p:#x} has no tensor storage "
                                     "to register")
                st = raw.untyped_storage()
                a, m = st.data_ptr(), st.nbytes()
                for r in [r for r in self._regions[self._fixed:] if r[0] < a + m and a < r[0] + r[1]]:
                    try:
                        store.unregister_buffer(r[0])
                    except MooncakeError as e:
                        logger.debug("mooncake-go lmcache plugin: unregistering %#x: %s", r[0], e)
                    self._regions.remove(r)
                store.register_buffer(a, m)
                self._regions.append((a, m))

    # -- calls in worker threads ------------------------------------------

    async def _call(self, objs: Sequence[MemoryObj], fn, *args):
        """fn(*args) in a worker thread, objs referenced until it returns.
        The caller holds its references while it awaits; only when it is
        cancelled, before it can drop them, are references of our own taken
        here, and dropped once the call returns (so the usual call costs no
        locked counter per object)."""
        fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.done():
                for o in objs:
                    o.ref_count_up()

                def release(_):
                    for o in objs:
                        o.ref_count_down()

                fut.add_done_callback(release)
            raise

    @staticmethod
    def _spans(objs: Sequence[MemoryObj]) -> Tuple[List[int], List[int]]:
        """The objects' addresses and sizes, read once per batch (each is a
        call into LMCache and torch)."""
        return [o.data_ptr for o in objs], [o.get_size() for o in objs]

    async def _batch(self, store: Store, fn, names: List[str], objs: Sequence[MemoryObj],
                     addrs: List[int], sizes: List[int], *extra) -> list:
        """fn(names, addrs, sizes, *extra) over objs, cut into up to
        settings.streams slices run at once (the store checksums and copies
        a slice on one thread; slices use the other cores and overlap one
        slice's master round trips with another's copies). One result per
        name; a slice whose whole call failed gives its error for each."""
        n = len(names)
        k = max(1, min(self.settings.streams, n, sum(sizes) // max(self.settings.stream_min_bytes, 1)))
        cuts = [n * i // k for i in range(k + 1)]
        parts = await asyncio.gather(*[
            self._call(objs[a:b], fn, names[a:b], addrs[a:b], sizes[a:b], *extra) for a, b in zip(cuts, cuts[1:])
        ], return_exceptions=True)
        out: list = []
        for (a, b), r in zip(zip(cuts, cuts[1:]), parts):
            if isinstance(r, MooncakeError):
                self._link.failed(store, r)
                r = [r] * (b - a)
            elif isinstance(r, BaseException):
                raise r
            out.extend(r)
        return out

    def _store(self) -> Store:
        store = self._link.get()
        if store is None:
            raise StoreUnavailable(f"mooncake-go lmcache plugin: store at {self.settings.master} is unavailable")
        return store

    # -- puts --------------------------------------------------------------

    def support_batched_put(self) -> bool:
        return True

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        await self.batched_put([key], [memory_obj])

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]):
        """Stores the chunks with one batch_put_from, straight from LMCache's
        pool. A chunk already stored counts as stored (puts are write-once
        and equal keys hold equal KV); any other failure raises PutFailed,
        which LMCache logs (and counts, for a single put)."""
        if not keys:
            return
        store = self._store()
        names = [k.to_string() for k in keys]
        addrs, sizes = self._spans(memory_objs)
        self._cover(store, memory_objs, addrs, sizes)
        results = await self._batch(store, store.batch_put_from, names, memory_objs, addrs, sizes, self.replicate)
        bad = [(n, r) for n, r in zip(names, results) if r is not None and not isinstance(r, ObjectAlreadyExists)]
        if bad:
            for _, r in bad:
                self._link.failed(store, r)
            raise PutFailed(f"mooncake-go lmcache plugin: {len(bad)} of {len(names)} chunks not stored "
                            f"(first {bad[0][0]}: {bad[0][1]})")

    # -- gets --------------------------------------------------------------

    def support_batched_get(self) -> bool:
        return True

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return (await self.batched_get([key]))[0]

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """Reads the chunks with one batch_get_into straight into memory
        objects from LMCache's pool; None for a chunk that is absent, could
        not be read, or found no room in the pool."""
        out: List[Optional[MemoryObj]] = [None] * len(keys)
        if not keys:
            return out
        try:
            store = self._store()
        except StoreUnavailable as e:
            logger.debug("%s", e)
            return out
        objs = self._allocate(len(keys))
        idx = [i for i, o in enumerate(objs) if o is not None]
        if not idx:
            logger.warning("mooncake-go lmcache plugin: no room in LMCache's pool for %d chunks", len(keys))
            return out
        held = [objs[i] for i in idx]
        names = [keys[i].to_string() for i in idx]
        try:
            addrs, sizes = self._spans(held)
            self._cover(store, held, addrs, sizes)
            results = await self._batch(store, store.batch_get_into, names, held, addrs, sizes)
        except MooncakeError as e:  # registering a memory object's storage failed
            self._link.failed(store, e)
            results = [e] * len(held)
        except asyncio.CancelledError:
            # Ours go now; _call's own reference keeps them until the store call returns.
            for o in held:
                o.ref_count_down()
            raise
        for i, obj, name, r in zip(idx, held, names, results):
            if isinstance(r, int) and not isinstance(r, bool) and r > 0:
                try:
                    out[i] = self.reshape_partial_chunk(obj, r)
                    continue
                except ValueError as e:
                    logger.warning("mooncake-go lmcache plugin: %s: %s", name, e)
            elif not isinstance(r, ObjectNotFound):
                self._link.failed(store, r)
                logger.warning("mooncake-go lmcache plugin: get %s: %s", name, r)
            obj.ref_count_down()
        return out

    def _allocate(self, n: int) -> List[Optional[MemoryObj]]:
        """n full-chunk memory objects from LMCache's CPU backend, all at
        once if it can; otherwise as many as fit (None for the rest)."""
        cpu = self.local_cpu_backend
        try:
            objs = cpu.batched_allocate(self.meta_shapes, self.meta_dtypes, n, self.meta_fmt, busy_loop=False)
        except (NotImplementedError, AssertionError):  # an allocator without batches (LMCache's ad hoc one)
            objs = None
        if objs is not None:
            return list(objs)
        return [cpu.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt, busy_loop=False) for _ in range(n)]

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[CacheEngineKey]) -> List[MemoryObj]:
        """The leading run of chunks that came back (one batched get, not
        one get per key); the chunks after the first miss are released."""
        run: List[MemoryObj] = []
        broken = False
        for obj in await self.batched_get(keys):
            if obj is None:
                broken = True
            elif broken:
                obj.ref_count_down()
            else:
                run.append(obj)
        return run

    # -- lookups -----------------------------------------------------------

    async def exists(self, key: CacheEngineKey) -> bool:
        return await asyncio.get_running_loop().run_in_executor(None, self.exists_sync, key)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._leading([key]) == 1

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        return self._leading(keys)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False) -> int:
        """How many leading chunks the store holds: one batch exists."""
        return await asyncio.get_running_loop().run_in_executor(None, self._leading, keys)

    def _leading(self, keys: Sequence[CacheEngineKey]) -> int:
        if not keys:
            return 0
        store = self._link.get()
        if store is None:
            return 0
        try:
            present = store.batch_exists([k.to_string() for k in keys])
        except MooncakeError as e:
            self._link.failed(store, e)
            logger.warning("mooncake-go lmcache plugin: exists of %d chunks failed: %s", len(keys), e)
            return 0
        return leading_true(present)

    # -- the rest of LMCache's interface ------------------------------------

    def remove_sync(self, key: CacheEngineKey) -> bool:
        store = self._store()
        try:
            store.remove(key.to_string())
            return True
        except ObjectNotFound:
            return False
        except MooncakeError as e:
            self._link.failed(store, e)
            raise

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when the master answers, else the failure's status code."""
        store = self._link.get()
        if store is None:
            return -1
        try:
            await asyncio.get_running_loop().run_in_executor(None, store.exists, PING_KEY)
            return 0
        except MooncakeError as e:
            self._link.failed(store, e)
            return e.code if isinstance(getattr(e, "code", None), int) else -1

    async def list(self) -> List[str]:
        # A store client cannot enumerate the pool's keys.
        return []

    async def close(self):
        self._link.close()
        logger.info("mooncake-go lmcache plugin: closed")

    def __repr__(self) -> str:
        return f"<MooncakeGoConnector {self.settings.master}>"


def leading_true(flags: Sequence[bool]) -> int:
    for i, f in enumerate(flags):
        if not f:
            return i
    return len(flags)


def pool_buffer(allocator) -> Optional[Tuple[int, int]]:
    """(address, length) of the one contiguous buffer LMCache's CPU
    allocator hands memory objects out of, if it exposes one: the mixed
    allocator's ``buffer``, the lazy allocator's underlying buffer, or the
    pinned allocator's ``buffer``."""
    candidates = [getattr(allocator, "buffer", None)]
    underlying = getattr(allocator, "get_underlying_buffer", None)
    if callable(underlying):
        try:
            candidates.append(underlying())
        except Exception:  # an allocator that has none
            pass
    candidates.append(getattr(getattr(allocator, "pin_allocator", None), "buffer", None))
    for t in candidates:
        if t is not None and hasattr(t, "data_ptr") and t.numel() > 0:
            return t.data_ptr(), t.numel() * t.element_size()
    return None
