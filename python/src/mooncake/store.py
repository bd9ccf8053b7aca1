"""mooncake.store: Mooncake's Python Store API on mooncake-go.

Same classes (MooncakeDistributedStore, ReplicateConfig), method names,
positional and keyword arguments and integer return codes as the official
``mooncake.store`` module, so vLLM's MooncakeStoreConnector, SGLang's
mooncake HiCache backend and LMCache's ``mooncakestore://`` connector
import it unchanged::

    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 512 << 20, 128 << 20,
                   "tcp", "", "127.0.0.1:50051") == 0
    s.register_buffer(ptr, nbytes)
    s.batch_put_from(keys, ptrs, sizes)        # [0, 0, ...]
    s.batch_get_into(keys, ptrs, sizes)        # [bytes read, ...]

Return conventions (as the original): 0 or a negative Mooncake error code
for writes and removes; bytes read or a negative code for reads; 1/0/-1
for existence; ``get`` returns b"" for a missing key.

``master_server_addr`` is the master's "host:port", or "etcd://h:p;..."
for an HA cluster (what ``mooncake up`` prints after ``--master``).
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
from typing import Dict, List, Optional

import mooncake_go
from mooncake_go import errors
from mooncake_go import parse_size as _parse_size  # 4GB = 4 GiB, as Mooncake and the CLI
from mooncake_go.store import Replicate

from . import _offload
from ._tensor_ext import TensorExt  # parallelism layouts, tp_from, safetensors

log = logging.getLogger("mooncake.store")

# Mooncake's ErrorCode values the compat layer returns itself.
_INTERNAL = -1
_INVALID_PARAMS = -600
_OBJECT_NOT_FOUND = -704


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicateConfig:
    """Mooncake's ReplicateConfig: attributes as the original's.

    ``replica_num`` replicas (1), ``with_hard_pin``, soft pin through
    ``soft_pin_action`` = SoftPinAction.ENABLE or the older
    ``with_soft_pin`` = True, ``soft_pin_ttl_ms``, ``preferred_segment``
    / ``preferred_segments`` (segment names, e.g. get_hostname() of a
    client), ``prefer_alloc_in_same_node`` (place on this host first).
    ``stripe_count`` (an addition of this implementation): pieces each
    replica is cut into, read in parallel (1: none; 0: the master's
    policy).
    Fields of the original that have no meaning here (dfs/nof replicas,
    group ids, data type) are accepted and ignored.
    """

    def __init__(self):
        self.replica_num: int = 1
        self.with_hard_pin: bool = False
        self.soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms: Optional[int] = None
        self.preferred_segment: str = ""
        self.preferred_segments: List[str] = []
        self.prefer_alloc_in_same_node: bool = False
        self.stripe_count: int = 0
        self.dfs_replica_num: int = 0
        self.nof_replica_num: int = 0
        self.preferred_nof_segments: List[str] = []
        self.group_ids = None
        self.data_type = 0
        # Put-session ids of the official config (its put sessions pass
        # them); accepted and not used: puts here are whole.
        self.session_ids: List[str] = []

    @property
    def with_soft_pin(self) -> bool:
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, v: bool) -> None:
        self.soft_pin_action = SoftPinAction.ENABLE if v else SoftPinAction.PRESERVE

    def _native(self) -> Replicate:
        segs = list(self.preferred_segments or [])
        if self.preferred_segment:
            segs.insert(0, self.preferred_segment)
        return Replicate(
            replicas=max(int(self.replica_num), 1),
            soft_pin=self.soft_pin_action == SoftPinAction.ENABLE,
            hard_pin=bool(self.with_hard_pin),
            soft_pin_ttl_ms=int(self.soft_pin_ttl_ms or 0),
            prefer_local=bool(self.prefer_alloc_in_same_node),
            preferred_segments=tuple(segs),
            stripe_count=int(self.stripe_count or 0),
        )

    def __repr__(self) -> str:
        return (f"ReplicateConfig(replica_num={self.replica_num}, with_hard_pin={self.with_hard_pin}, "
                f"soft_pin_action={self.soft_pin_action!r}, preferred_segment={self.preferred_segment!r})")


class BufferHandle(bytearray):
    """Bytes read by get_buffer: ``ptr()`` is their address, ``size()``
    their length; the handle is also the bytes themselves (a bytearray,
    so memoryview(h) and bytes(h) work) and keeps them alive."""

    def ptr(self) -> int:
        if not self:
            return 0
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))

    def size(self) -> int:
        return len(self)


def _memory(addr: int, n: int):
    """The n bytes at addr, uncopied (a ctypes array; b"" for none)."""
    n = int(n)
    return (ctypes.c_char * n).from_address(int(addr)) if n > 0 else b""


def _code(e: errors.MooncakeError) -> int:
    return e.code if e.code < 0 else _INTERNAL


def _codes(results: list) -> List[int]:
    """The official integers for the results of a mooncake_go batch call:
    0 for None, a length as it is, an error's code."""
    return [0 if r is None else r if isinstance(r, int) else _code(r) for r in results]


def _ints(xs) -> List[int]:
    """Addresses or sizes as Python ints (numpy's integers too): the
    native API reads an int as an address, anything else as a buffer."""
    return [int(x) for x in xs]


def _rc(config: Optional[ReplicateConfig]) -> Optional[Replicate]:
    return None if config is None else config._native()


class MooncakeDistributedStore(TensorExt):
    """Mooncake's ``mooncake.store.MooncakeDistributedStore`` over mooncake-go."""

    def __init__(self):
        self._store: Optional[mooncake_go.Store] = None
        self._buffers: Dict[int, int] = {}  # registered addr -> size

    # -- setup -----------------------------------------------------------

    def setup(self, *args, **kwargs) -> int:
        """Either ``setup(local_hostname, metadata_server, global_segment_size,
        local_buffer_size, protocol, rdma_devices, master_server_addr,
        engine=None, ...)`` or ``setup(config: dict)``; 0 on success.
        enable_ssd_offload/ssd_offload_path give it an SSD tier (_offload)."""
        with _offload.environment(*_offload.from_setup(args, kwargs)) as bad:
            if bad is not None:
                logging.getLogger(__name__).error("setup: %s", bad)
                return _INVALID_PARAMS
            if len(args) == 1 and not kwargs and isinstance(args[0], dict):
                return self._setup_dict(args[0])
            if "config" in kwargs and not args and isinstance(kwargs["config"], dict):
                return self._setup_dict(kwargs["config"])
            return self._setup(*args, **kwargs)

    def _setup_dict(self, c: dict) -> int:
        if "local_hostname" not in c or "metadata_server" not in c:
            return _INVALID_PARAMS
        try:
            return self._setup(
                c["local_hostname"], c["metadata_server"],
                _parse_size(c.get("global_segment_size", 16 << 20)),
                _parse_size(c.get("local_buffer_size", 16 << 20)),
                c.get("protocol", "tcp"), c.get("rdma_devices", c.get("device_name", "")),
                c.get("master_server_addr", c.get("master_server_address", "")),
                tenant_id=c.get("tenant_id", "default"),
            )
        except ValueError:
            return _INVALID_PARAMS

    def _setup(self, local_hostname: str, metadata_server: str, global_segment_size: int, local_buffer_size: int,
               protocol: str, rdma_devices: str, master_server_addr: str, engine=None,
               enable_ssd_offload: bool = False, ssd_offload_path: str = "", tenant_id: str = "default",
               enable_client_http_server: bool = False, client_http_port: int = 9300) -> int:
        if self._store is not None:
            return _INVALID_PARAMS
        if not master_server_addr:
            return _INVALID_PARAMS
        native_engine = None
        if engine is not None:
            native_engine = engine.get_engine() if hasattr(engine, "get_engine") else engine
        seg = int(global_segment_size)
        # "tcp" and "shm" as asked; "rdma" (vLLM's default) lets the engine
        # choose (shared memory on this host, TCP elsewhere); others: TCP.
        proto = (protocol or "").lower()
        proto = proto if proto in ("tcp", "shm", "rdma") else None
        meta = metadata_server or None
        if meta and meta != "P2PHANDSHAKE" and "://" not in meta:
            meta = "etcd://" + meta
        try:
            self._store = mooncake_go.Store(
                master_server_addr,
                segment_size=seg if seg > 0 else -1,
                local_buffer_size=int(local_buffer_size) if int(local_buffer_size) > 0 else 0,
                local_hostname=local_hostname or None,
                metadata=meta,
                protocol=proto,
                engine=native_engine,
                # Mooncake's put of a key that exists succeeds (0).
                exist_ok=True,
                # The default leaves the tenant to MOONCAKE_TENANT_ID, else
                # "default" (docs/tenants.md).
                tenant_id=None if tenant_id in (None, "", "default") else str(tenant_id),
            )
        except errors.MooncakeError as e:
            return _code(e)
        except ValueError:  # a tenant the library is too old for
            return _INVALID_PARAMS
        return 0

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """Kept for signature compatibility: use setup()."""
        return 0 if self._store is not None else _INVALID_PARAMS

    def get_hostname(self) -> str:
        """This client's segment name (for ReplicateConfig.preferred_segment)."""
        try:
            return self._s().name
        except errors.MooncakeError:
            return ""

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable."""
        if self._store is None:
            return 1
        try:
            self._store.exists("__mooncake_go_health_check__")
            return 0
        except errors.InvalidHandle:
            return 1
        except errors.MooncakeError:
            return 2

    def close(self) -> int:
        st, self._store = self._store, None
        if st is None:
            return 0
        try:
            st.close()
            return 0
        except errors.MooncakeError as e:
            return _code(e)

    # -- buffers ---------------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        try:
            self._s().register_buffer(int(buffer_ptr), int(size))
        except errors.MooncakeError as e:
            return _code(e)
        self._buffers[int(buffer_ptr)] = int(size)
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        try:
            self._s().unregister_buffer(int(buffer_ptr))
        except errors.MooncakeError as e:
            return _code(e)
        self._buffers.pop(int(buffer_ptr), None)
        return 0

    # -- bytes API -------------------------------------------------------

    def put(self, key: str, value, config: Optional[ReplicateConfig] = None) -> int:
        try:
            self._s().put(key, value, _rc(config))
            return 0
        except errors.MooncakeError as e:
            return _code(e)

    def upsert(self, key: str, value, config: Optional[ReplicateConfig] = None) -> int:
        try:
            self._s().upsert(key, value, _rc(config))
            return 0
        except errors.MooncakeError as e:
            return _code(e)

    def put_parts(self, key: str, *parts, config: Optional[ReplicateConfig] = None) -> int:
        """Stores the concatenation of parts as one object, written from
        the parts themselves (see _write_values)."""
        return self._write_values([key], [list(parts)], config, False)[0]

    def upsert_parts(self, key: str, *parts, config: Optional[ReplicateConfig] = None) -> int:
        return self._write_values([key], [list(parts)], config, True)[0]

    def put_batch(self, keys: List[str], values: List, config: Optional[ReplicateConfig] = None) -> int:
        """0 when every put succeeded, else the first failure's code."""
        return self._first(self._batch_put(keys, values, config, upsert=False))

    def upsert_batch(self, keys: List[str], values: List, config: Optional[ReplicateConfig] = None) -> int:
        return self._first(self._batch_put(keys, values, config, upsert=True))

    def _batch_put(self, keys, values, config, upsert) -> List[int]:
        if len(keys) != len(values):
            return [_INVALID_PARAMS] * len(keys)
        try:
            st = self._s()
            put = st.batch_upsert if upsert else st.batch_put
            return _codes(put(keys, values, _rc(config)))
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)

    @staticmethod
    def _first(codes: List[int]) -> int:
        for c in codes:
            if c != 0:
                return c
        return 0

    def get(self, key: str) -> bytes:
        """The value of key, or b"" when it is missing or unreadable."""
        try:
            return self._s().get(key)
        except errors.MooncakeError:
            return b""

    def get_batch(self, keys: List[str]) -> List[bytes]:
        return [self.get(k) for k in keys]

    def get_buffer(self, key: str) -> Optional[BufferHandle]:
        """The value of key in a BufferHandle, or None when missing."""
        try:
            st = self._s()
            size = st.get_size(key)
            h = BufferHandle(size)
            if size:
                n = st.get_into(key, h)
                del h[n:]
            return h
        except errors.MooncakeError:
            return None

    def batch_get_buffer(self, keys: List[str]) -> List[Optional[BufferHandle]]:
        return [self.get_buffer(k) for k in keys]

    # -- zero-copy API ---------------------------------------------------

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        try:
            self._s().put_from(key, int(buffer_ptr), int(size), _rc(config))
            return 0
        except errors.MooncakeError as e:
            return _code(e)

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        # Upsert reads any memory: registered memory is read directly.
        try:
            self._s().upsert_from(key, int(buffer_ptr), int(size), _rc(config))
            return 0
        except errors.MooncakeError as e:
            return _code(e)

    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int, size: int,
                               metadata_size: int, config: Optional[ReplicateConfig] = None) -> int:
        """Stores metadata then data as one object."""
        parts = [_memory(metadata_buffer_ptr, metadata_size), _memory(buffer_ptr, size)]
        return self._write_values([key], [parts], config, False)[0]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read into buffer_ptr, or a negative code."""
        try:
            return self._s().get_into(key, int(buffer_ptr), int(size))
        except errors.MooncakeError as e:
            return _code(e)

    def batch_put_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                       config: Optional[ReplicateConfig] = None) -> List[int]:
        """0 or a negative code per key."""
        return self._batch_from(False, keys, buffer_ptrs, sizes, config)

    def batch_upsert_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                          config: Optional[ReplicateConfig] = None) -> List[int]:
        return self._batch_from(True, keys, buffer_ptrs, sizes, config)

    def _batch_from(self, upsert: bool, keys, buffer_ptrs, sizes, config) -> List[int]:
        try:
            st = self._s()
            put = st.batch_upsert_from if upsert else st.batch_put_from
            return _codes(put(keys, _ints(buffer_ptrs), _ints(sizes), _rc(config)))
        except (ValueError, TypeError):
            return [_INVALID_PARAMS] * len(keys)
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)

    def batch_get_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        """Bytes read (> 0) or a negative code per key."""
        try:
            return _codes(self._s().batch_get_into(keys, _ints(buffer_ptrs), _ints(sizes)))
        except (ValueError, TypeError):
            return [_INVALID_PARAMS] * len(keys)
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)

    def batch_put_from_multi_buffers(self, keys: List[str], all_buffer_ptrs: List[List[int]],
                                     all_sizes: List[List[int]], config: Optional[ReplicateConfig] = None) -> List[int]:
        """Each key's value is the concatenation of its buffers (registered
        with register_buffer), written from them directly; 0 or a negative
        code per key."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [_INVALID_PARAMS] * len(keys)
        try:
            parts = [_ints(ps) for ps in all_buffer_ptrs]
            return _codes(self._s().batch_put_from_parts(keys, parts, all_sizes, _rc(config)))
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)
        except (ValueError, TypeError, OverflowError):
            return [_INVALID_PARAMS] * len(keys)

    def batch_get_into_multi_buffers(self, keys: List[str], all_buffer_ptrs: List[List[int]],
                                     all_sizes: List[List[int]], prefer_alloc_in_same_node: bool = False) -> List[int]:
        """Reads each key's value across its (registered) buffers in order,
        straight into them; bytes read or a negative code per key."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [_INVALID_PARAMS] * len(keys)
        try:
            parts = [_ints(ps) for ps in all_buffer_ptrs]
            return _codes(self._s().batch_get_into_parts(keys, parts, all_sizes))
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)
        except (ValueError, TypeError, OverflowError):
            return [_INVALID_PARAMS] * len(keys)

    def is_exist(self, key: str) -> int:
        """1 present, 0 absent, -1 error."""
        try:
            return 1 if self._s().exists(key) else 0
        except errors.MooncakeError:
            return -1

    def batch_is_exist(self, keys: List[str]) -> List[int]:
        """1/0/-1 per key."""
        try:
            got = self._s().batch_exists(keys, raise_on_error=False)
        except errors.MooncakeError:
            return [-1] * len(keys)
        return [int(x) if isinstance(x, bool) else -1 for x in got]

    def get_size(self, key: str) -> int:
        try:
            return self._s().get_size(key)
        except errors.MooncakeError as e:
            return _code(e)

    def remove(self, key: str, force: bool = False) -> int:
        try:
            self._s().remove(key, force)
            return 0
        except errors.MooncakeError as e:
            return _code(e)

    def batch_remove(self, keys: List[str], force: bool = False) -> List[int]:
        """0 or a negative code per key."""
        try:
            return _codes(self._s().batch_remove(keys, force))
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)

    def remove_all(self, force: bool = False) -> int:
        """Number of objects removed, or a negative code."""
        try:
            return self._s().remove_all(force)
        except errors.MooncakeError as e:
            return _code(e)

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Removes the objects whose key the pattern matches (an RE2
        search, so "^prefix" for a prefix); the number removed, or a
        negative code."""
        try:
            return self._s().remove_by_regex(regex_pattern, force)
        except errors.MooncakeError as e:
            return _code(e)

    def _s(self) -> "mooncake_go.Store":
        if self._store is None:
            raise errors.InvalidHandle(errors.INVALID_HANDLE, errors.DOMAIN_ABI, "INVALID_HANDLE",
                                       "MooncakeDistributedStore is not set up")
        return self._store


__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "BufferHandle"]


# -- the rest of the official surface (see _store_ext) ----------------------

from . import _store_ext as _x  # noqa: E402
from ._store_ext import (  # noqa: E402,F401
    Descriptor, DiskDescriptor, MemoryDescriptor, MooncakeHostMemAllocator, ObjectDataType, ReplicaDescriptor,
    ReplicaStatus, TaskStatus, TaskType, bind_to_numa_node,
)

# The official module exports the enum members at module level too; where
# two enums share a name (PROCESSING, FAILED) the task status wins, as there.
for _e in (ObjectDataType, ReplicaStatus, TaskStatus, TaskType):
    globals().update(_e.__members__)
del _e


def _ranged_codes(st: "mooncake_go.Store", get: bool, keys, ptr_lists, size_lists, offset_lists) -> List[int]:
    """Bytes moved or a negative code per key of a ranged read (get) or a
    put session's write of keys[i]: size_lists[i][j] bytes between
    ptr_lists[i][j] and offset offset_lists[i][j] of the value. A key
    whose three lists differ in length is -600 without being sent; outer
    lists that differ in number raise ValueError."""
    n = len(keys)
    if len(ptr_lists) != n or len(size_lists) != n or len(offset_lists) != n:
        raise ValueError("keys, buffer lists, size lists and offset lists differ in number")
    codes = [_INVALID_PARAMS] * n
    send = [i for i in range(n) if len(ptr_lists[i]) == len(size_lists[i]) == len(offset_lists[i])]
    if send:
        ranges = [list(zip(_ints(offset_lists[i]), _ints(ptr_lists[i]), _ints(size_lists[i]))) for i in send]
        move = st.batch_get_ranges if get else st.batch_put_ranges
        for i, c in zip(send, _codes(move([keys[i] for i in send], ranges))):
            codes[i] = c
    return codes


def _ranged(store, get: bool, keys, ptr_lists, size_lists, offset_lists) -> List[int]:
    """_ranged_codes on the store store() returns, with its errors as codes."""
    try:
        return _ranged_codes(store(), get, keys, ptr_lists, size_lists, offset_lists)
    except errors.MooncakeError as e:
        return [_code(e)] * len(keys)
    except (ValueError, TypeError, OverflowError):
        return [_INVALID_PARAMS] * len(keys)


def _tp_key(key: str, rank: int, tp_size: int) -> str:
    return key if tp_size <= 1 else f"{key}_tp_{rank}"


class _StoreExt:
    """MooncakeDistributedStore's methods beyond the bytes API."""

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """A dummy client (SGLang's standalone storage, vLLM's
        standalone-store mode): the real client at server_address
        (``mooncake client``, port 50052 by default) holds the segment and
        the engine, and this store forwards to it, sharing its pool with
        the other ranks of the host. mem_pool_size bytes of shared memory
        back alloc_from_mem_pool; local_buffer_size [16 MiB if 0] stages
        buffers that are not shared. Memory from MooncakeHostMemAllocator,
        once registered with register_buffer, is shared too, so puts from
        and gets into it copy nothing. 0 on success; a negative code (RPC
        failure) when no real client listens there."""
        if self._store is not None:
            return _INVALID_PARAMS
        try:
            self._store = mooncake_go.DummyStore(str(server_address), mem_pool_size=max(int(mem_pool_size), 0),
                                                 local_buffer_size=max(int(local_buffer_size), 0))
        except errors.MooncakeError as e:
            return _code(e)
        except (TypeError, ValueError):
            return _INVALID_PARAMS
        return 0

    def alloc_from_mem_pool(self, size: int) -> int:
        """size bytes of host memory usable for zero-copy puts and gets (0
        on failure). A dummy client carves them from the memory it shares
        with its real client; another store allocates and registers them.
        They stay until the store closes."""
        if self._store is None:
            return 0
        if isinstance(self._store, mooncake_go.DummyStore):
            try:
                return self._store.alloc(int(size))
            except errors.MooncakeError:
                return 0
        if getattr(self, "_pool", None) is None:
            self._pool = MooncakeHostMemAllocator()
        p = self._pool.alloc(size)
        if p and self.register_buffer(p, size) != 0:
            self._pool.free(p)
            return 0
        return p

    def get_offload_rpc_read_count(self) -> int:
        """Reads served by offload RPCs: none here (SSD reads go through
        the engine)."""
        return 0

    # -- replicas, sessions, ranges --------------------------------------

    def get_replica_desc(self, key: str) -> List[ReplicaDescriptor]:
        """The replicas of key ([] when it is missing or on error)."""
        try:
            return [ReplicaDescriptor(d) for d in self._s().replicas(key)]
        except errors.MooncakeError:
            return []

    def batch_get_replica_desc(self, keys: List[str]) -> Dict[str, List[ReplicaDescriptor]]:
        return {k: self.get_replica_desc(k) for k in keys}

    def batch_get_session_start(self, keys: List[str]) -> List[int]:
        """Looks the keys up once and keeps their replicas for the ranged
        reads that follow; 0 or a negative code per key."""
        try:
            return _codes(self._s().get_session_start(keys))
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)

    def batch_get_session_end(self, keys: List[str]) -> int:
        try:
            self._s().get_session_end(keys)
            return 0
        except errors.MooncakeError as e:
            return _code(e)

    def batch_get_into_multi_buffer_ranges(self, keys: List[str], all_buffer_ptrs: List[List[int]],
                                           all_sizes: List[List[int]], all_src_offsets: List[List[int]]) -> List[int]:
        """For keys[i], reads all_sizes[i][j] bytes from offset
        all_src_offsets[i][j] of its value into all_buffer_ptrs[i][j];
        bytes read (the sum of the sizes) or a negative code per key. Keys
        without a session are looked up as any get."""
        return _ranged(self._s, True, keys, all_buffer_ptrs, all_sizes, all_src_offsets)

    def batch_put_session_start(self, keys: List[str], sizes: List[int],
                                config: Optional[ReplicateConfig] = None) -> List[int]:
        """Reserves room for values of sizes[i] bytes under keys[i] without
        writing them (one master round trip): 0 or a negative code per key
        (-705 for a key that exists, -600 for a zero size or a session
        already open). The values are written with
        batch_put_from_multi_buffer_ranges and become readable at
        batch_put_session_end."""
        try:
            return _codes(self._s().put_session_start(keys, sizes, _rc(config)))
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)
        except (ValueError, TypeError, OverflowError):
            return [_INVALID_PARAMS] * len(keys)

    def batch_put_from_multi_buffer_ranges(self, keys: List[str], all_buffer_ptrs: List[List[int]],
                                           all_sizes: List[List[int]], all_dst_offsets: List[List[int]]) -> List[int]:
        """For keys[i], writes all_sizes[i][j] bytes from all_buffer_ptrs[i][j]
        at offset all_dst_offsets[i][j] of its value, which a put session
        reserved; bytes written (the sum of the sizes) or a negative code
        per key (-600 without a session or for a range past the size)."""
        return _ranged(self._s, False, keys, all_buffer_ptrs, all_sizes, all_dst_offsets)

    def batch_put_session_end(self, keys: List[str]) -> List[int]:
        """Makes the values of keys readable and closes their sessions: 0
        or a negative code per key (-600 without a session)."""
        try:
            return _codes(self._s().put_session_end(keys))
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)

    def batch_put_session_revoke(self, keys: List[str]) -> List[int]:
        """Gives back the room reserved for keys and closes their sessions;
        the values never become readable. 0 or a negative code per key."""
        try:
            return _codes(self._s().put_session_revoke(keys))
        except errors.MooncakeError as e:
            return [_code(e)] * len(keys)

    def get_into_ranges(self, buffer_ptrs: List[int], all_keys: List[List[str]],
                        all_dst_offsets: List[List[List[int]]], all_src_offsets: List[List[List[int]]],
                        all_sizes: List[List[List[int]]]) -> List[List[List[int]]]:
        """For buffer i and its key j, reads all_sizes[i][j][k] bytes from
        offset all_src_offsets[i][j][k] of the value into buffer_ptrs[i] +
        all_dst_offsets[i][j][k]; the bytes read or a negative code per
        range, in the same nesting."""
        keys, ptrs, sizes, srcs, shape = [], [], [], [], []
        try:
            for i, base in enumerate(buffer_ptrs):
                row = []
                for j, key in enumerate(all_keys[i]):
                    dsts, ss, ns = all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j]
                    keys.append(key)
                    ptrs.append([int(base) + int(d) for d in dsts])
                    srcs.append(list(ss))
                    sizes.append(list(ns))
                    row.append(len(ns))
                shape.append(row)
            codes = _ranged_codes(self._s(), True, keys, ptrs, sizes, srcs)
        except errors.MooncakeError as e:
            return [[[_code(e)] * n for n in row] for row in shape] if shape else []
        except (ValueError, TypeError, OverflowError, IndexError):
            return [[[_INVALID_PARAMS] * len(s) for s in row] for row in all_sizes]
        out, f = [], 0
        for row in shape:
            r = []
            for n in row:
                c = codes[f]
                r.append([int(x) if c >= 0 else c for x in sizes[f]])
                f += 1
            out.append(r)
        return out

    # -- tensors ---------------------------------------------------------
    # Tensors are stored as the official store stores them (_store_ext's
    # header, then the bytes); reads return torch tensors when torch is
    # importable, numpy arrays otherwise, None for a missing or malformed
    # value.

    def _put_tensor(self, key, tensor, config, upsert: bool) -> int:
        return self._write_tensors([key], [tensor], [None], config, upsert, "put tensor")[0]

    def _put_tensors(self, keys, tensors, config, upsert: bool) -> List[int]:
        return self._write_tensors(keys, tensors, [None] * len(keys), config, upsert, "put tensor")

    def put_tensor(self, key: str, tensor) -> int:
        return self._put_tensor(key, tensor, None, False)

    def upsert_tensor(self, key: str, tensor) -> int:
        return self._put_tensor(key, tensor, None, True)

    def pub_tensor(self, key: str, tensor, config: Optional[ReplicateConfig] = None) -> int:
        return self._put_tensor(key, tensor, config, False)

    def upsert_pub_tensor(self, key: str, tensor, config: Optional[ReplicateConfig] = None) -> int:
        return self._put_tensor(key, tensor, config, True)

    def batch_put_tensor(self, keys: List[str], tensors_list: List) -> List[int]:
        return self._put_tensors(keys, tensors_list, None, False)

    def batch_upsert_tensor(self, keys: List[str], tensors_list: List) -> List[int]:
        return self._put_tensors(keys, tensors_list, None, True)

    def batch_pub_tensor(self, keys: List[str], tensors_list: List,
                         config: Optional[ReplicateConfig] = None) -> List[int]:
        return self._put_tensors(keys, tensors_list, config, False)

    def batch_upsert_pub_tensor(self, keys: List[str], tensors_list: List,
                                config: Optional[ReplicateConfig] = None) -> List[int]:
        return self._put_tensors(keys, tensors_list, config, True)

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Stores size bytes at buffer_ptr, already laid out as a stored
        tensor (header, then data: what get_tensor_into leaves there)."""
        return self.put_from(key, buffer_ptr, size)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self.upsert_from(key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        return self.batch_put_from(keys, buffer_ptrs, sizes)

    def batch_upsert_tensor_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        return self.batch_upsert_from(keys, buffer_ptrs, sizes)

    def get_tensor(self, key: str):
        h = self.get_buffer(key)
        return self._as_tensor(key, h) if h else None

    def batch_get_tensor(self, keys: List[str]) -> List:
        return [self.get_tensor(k) for k in keys]

    @staticmethod
    def _as_tensor(key, buf):
        meta = _x.parse_header(buf)
        if meta is None:
            log.error("get tensor %r: the value is not a stored tensor", key)
            return None
        return _x.make_tensor(buf, *meta)

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int):
        """Reads the stored tensor into the buffer (header included) and
        returns a tensor over the buffer's data part; None on failure."""
        n = self.get_into(key, buffer_ptr, size)
        return self._as_tensor(key, _x_memory(buffer_ptr, n)) if n > 0 else None

    def batch_get_tensor_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List:
        ns = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [self._as_tensor(k, _x_memory(p, n)) if n > 0 else None for k, p, n in zip(keys, buffer_ptrs, ns)]

    # Tensor parallelism (_tensor_ext's shard writes): a tensor cut along
    # split_dim into tp_size equal shards, each stored with SHARD metadata
    # under "<key>_tp_<rank>" (the key itself, whole, when tp_size is 1).
    # tp_rank is not used by the writes: every rank's shard is written.

    def put_tensor_with_tp(self, key: str, tensor, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        return self._write_tp([key], [tensor], None, tp_size, split_dim)[0]

    def pub_tensor_with_tp(self, key: str, tensor, config: Optional[ReplicateConfig] = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        return self._write_tp([key], [tensor], config, tp_size, split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys: List[str], tensors_list: List, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> List[int]:
        return self._write_tp(base_keys, tensors_list, None, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: List[str], tensors_list: List,
                                 config: Optional[ReplicateConfig] = None, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> List[int]:
        return self._write_tp(base_keys, tensors_list, config, tp_size, split_dim)

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0):
        """The shard of rank tp_rank (the whole tensor when tp_size is 1)."""
        return self.get_tensor(_tp_key(key, int(tp_rank), int(tp_size)))

    def batch_get_tensor_with_tp(self, base_keys: List[str], tp_rank: int = 0, tp_size: int = 1) -> List:
        return [self.get_tensor(_tp_key(k, int(tp_rank), int(tp_size))) for k in base_keys]

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0):
        return self.get_tensor_into(_tp_key(key, int(tp_rank), int(tp_size)), buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                      tp_rank: int = 0, tp_size: int = 1) -> List:
        keys = [_tp_key(k, int(tp_rank), int(tp_size)) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)


def _x_memory(addr: int, n: int):
    """A writable ctypes view of n bytes at addr (tensors share it)."""
    return (ctypes.c_char * int(n)).from_address(int(addr))


for _name, _fn in vars(_StoreExt).items():
    if not _name.startswith("__"):
        setattr(MooncakeDistributedStore, _name, _fn)
del _name, _fn

__all__ += ["Descriptor", "DiskDescriptor", "MemoryDescriptor", "MooncakeHostMemAllocator", "ObjectDataType",
            "ReplicaDescriptor", "ReplicaStatus", "TaskStatus", "TaskType", "bind_to_numa_node"]

from ._tensor_ext import (  # noqa: E402,F401
    BufferLease, BufferLeaseView, BufferPool, ParallelAxis, ReadTarget, RegisteredBufferLease,
    RegisteredBufferLeaseView, RegisteredBufferPool, TensorParallelism,
)
__all__ += ["BufferLease", "BufferLeaseView", "BufferPool", "ParallelAxis", "ReadTarget", "RegisteredBufferLease",
            "RegisteredBufferLeaseView", "RegisteredBufferPool", "TensorParallelism"]
