"""The rest of the official ``mooncake.store`` surface: enums, replica
descriptors, the host memory allocator, NUMA binding, and the store
methods built on the C ABI 1.3 (ranged reads, get sessions, replica
descriptors) and on the tensor format. ``mooncake.store`` re-exports all
of it; the names the official module has that this package does not serve
are listed, each with its reason, in ``mooncake._surface_exceptions``.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import struct
import threading
from typing import Optional

import mooncake_go

log = logging.getLogger("mooncake.store")


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ObjectDataType(enum.IntEnum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class TaskStatus(enum.IntEnum):
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class TaskType(enum.IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class Descriptor:
    """Where the bytes of a memory replica are: ``buffer_address`` in the
    segment owner reached at ``transport_endpoint``, ``size`` bytes."""

    def __init__(self, buffer_address: int = 0, size: int = 0, transport_endpoint: str = ""):
        self.buffer_address = buffer_address
        self.size = size
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return f"Descriptor(buffer_address={self.buffer_address:#x}, size={self.size}, " \
               f"transport_endpoint={self.transport_endpoint!r})"


class MemoryDescriptor:
    def __init__(self, buffer_descriptor: Optional[Descriptor] = None):
        self.buffer_descriptor = buffer_descriptor


class DiskDescriptor:
    def __init__(self, file_path: str = "", object_size: int = 0):
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One replica of an object (get_replica_desc): in memory, in a file,
    or on a client's local SSD tier (``is_local_disk_replica``; read with
    ``get_memory_descriptor``, as it is served by that client's engine)."""

    def __init__(self, d: Optional[dict] = None):
        if d is None:
            d = dict(kind="memory", status=0, buffer_address=0, size=0, segment_name="", transport_endpoint="",
                     file_path="")
        self._d = d
        self.status = ReplicaStatus(d["status"]) if d["status"] in ReplicaStatus._value2member_map_ \
            else ReplicaStatus.UNDEFINED
        self.segment_name: str = d["segment_name"]

    def is_memory_replica(self) -> bool:
        return self._d["kind"] == "memory"

    def is_disk_replica(self) -> bool:
        return self._d["kind"] == "disk"

    def is_local_disk_replica(self) -> bool:
        return self._d["kind"] == "local_disk"

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if self._d["kind"] == "disk":
            raise RuntimeError("not a memory replica")
        return MemoryDescriptor(Descriptor(self._d["buffer_address"], self._d["size"], self._d["transport_endpoint"]))

    def get_disk_descriptor(self) -> DiskDescriptor:
        if self._d["kind"] != "disk":
            raise RuntimeError("not a disk replica")
        return DiskDescriptor(self._d["file_path"], self._d["size"])

    def __repr__(self) -> str:
        return f"ReplicaDescriptor({self._d['kind']}, {self.status.name}, segment={self.segment_name!r})"


class MooncakeHostMemAllocator:
    """Host memory for KV caches (SGLang's standalone-storage mode).

    ``alloc(size)`` returns the address of ``size`` bytes of page-aligned,
    zeroed memory backed by a memfd (0 on failure); ``free(ptr)`` releases
    it (0, or -1 for an address alloc did not return). As the official
    allocator's, the memory can be shared with a real client: a dummy
    store (setup_dummy) that registers it hands its fd to the real client,
    which maps the same pages, so puts and gets of it copy nothing. Any
    other store registers it like any buffer."""

    def __init__(self):
        self._ptrs: set = set()
        self._lock = threading.Lock()

    def alloc(self, size: int) -> int:
        addr = mooncake_go.alloc_shared(int(size))
        if addr:
            with self._lock:
                self._ptrs.add(addr)
        return addr

    def free(self, ptr: int) -> int:
        with self._lock:
            if int(ptr) not in self._ptrs:
                return -1
            self._ptrs.discard(int(ptr))
        if not mooncake_go.free_shared(int(ptr)):
            # A view of the memory is still alive (a tensor made from the
            # address, say): keep it until it goes.
            with self._lock:
                self._ptrs.add(int(ptr))
            return -1
        return 0


def bind_to_numa_node(node: int) -> None:
    """Runs the calling thread on the CPUs of NUMA node ``node``, as the
    official function does (which also sets the memory policy; here the
    kernel's first-touch placement follows the CPUs). A host without that
    node, or without NUMA, gets a warning and no change."""
    node = int(node)
    path = f"/sys/devices/system/node/node{node}/cpulist"
    try:
        with open(path) as f:
            cpus = _cpulist(f.read())
    except OSError:
        log.warning("bind_to_numa_node: no NUMA node %d on this host", node)
        return None
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        log.warning("bind_to_numa_node(%d): %s", node, e)
    return None


def _cpulist(s: str) -> set:
    """The CPUs of a sysfs cpulist ("0-3,8,10-11")."""
    out = set()
    for part in s.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


# -- tensors ---------------------------------------------------------------
# A tensor is stored as the official store (0.3.13) stores it, so either
# implementation reads what the other wrote: a 304-byte TensorMetadata,
# then the bytes. The metadata is a 40-byte object header (u32 magic
# "NOOM", u16 version 1, u16 header size 304, i32 dtype, i32 ndim, u32
# layout FULL 0 / SHARD 1, u32 flags, u64 data offset, u64 data bytes),
# the global and the local shape (int64[8] each, -1 past ndim), u32 axis
# count, u32 reserved, and 4 layout axes (i32 kind, index, shard rank,
# shard count, split dim, reserved0; i64 reserved1), all little-endian.

_OBJECT = struct.Struct("<IHHiiIIQQ")
_SHAPES = struct.Struct("<8q8qII")
_AXIS = struct.Struct("<6iq")
MAX_TENSOR_DIMS = 8
MAX_LAYOUT_AXES = 4
TENSOR_MAGIC = 0x4D4F4F4E
TENSOR_HEADER_SIZE = _OBJECT.size + _SHAPES.size + MAX_LAYOUT_AXES * _AXIS.size  # 304
LAYOUT_FULL, LAYOUT_SHARD = 0, 1

# TensorDtype numbers -> (torch dtype name, numpy dtype string, item size).
# numpy has no bfloat16/float8: those come back as raw uint16/uint8 arrays.
_DTYPES = [
    ("float32", "<f4", 4), ("float64", "<f8", 8), ("int8", "i1", 1), ("uint8", "u1", 1),
    ("int16", "<i2", 2), ("uint16", "<u2", 2), ("int32", "<i4", 4), ("uint32", "<u4", 4),
    ("int64", "<i8", 8), ("uint64", "<u8", 8), ("bool", "?", 1), ("float16", "<f2", 2),
    ("bfloat16", "<u2", 2), ("float8_e4m3fn", "u1", 1), ("float8_e5m2", "u1", 1),
]
_BY_NAME = {name: i for i, (name, _, _) in enumerate(_DTYPES)}
_NUMPY_KIND = {"f4": 0, "f8": 1, "i1": 2, "u1": 3, "i2": 4, "u2": 5, "i4": 6, "u4": 7, "i8": 8, "u8": 9,
               "b1": 10, "f2": 11}


def dtype_code(t) -> int:
    """The TensorDtype number of a torch tensor or numpy array; -1 unknown."""
    dt = getattr(t, "dtype", None)
    name = str(dt).replace("torch.", "")
    if name in _BY_NAME:
        return _BY_NAME[name]
    try:
        key = f"{dt.kind}{dt.itemsize}"
        return _NUMPY_KIND.get(key, -1)
    except AttributeError:
        return -1


def item_size(code: int) -> int:
    return _DTYPES[code][2]


def build_metadata(code: int, global_shape, local_shape, data_bytes: int, layout: int = LAYOUT_FULL,
                   axes=()) -> bytes:
    """A TensorMetadata; axes are (kind, rank, count, split_dim, reserved0,
    reserved1) tuples, at most 4 (ValueError for too many dimensions)."""
    g, loc = [int(x) for x in global_shape], [int(x) for x in local_shape]
    if len(g) > MAX_TENSOR_DIMS or len(loc) != len(g):
        raise ValueError(f"a tensor of {len(g)} dimensions (at most {MAX_TENSOR_DIMS})")
    if len(axes) > MAX_LAYOUT_AXES:
        raise ValueError(f"{len(axes)} layout axes (at most {MAX_LAYOUT_AXES})")
    pad = [-1] * (MAX_TENSOR_DIMS - len(g))
    out = [_OBJECT.pack(TENSOR_MAGIC, 1, TENSOR_HEADER_SIZE, code, len(g), layout, 0, TENSOR_HEADER_SIZE,
                        int(data_bytes)),
           _SHAPES.pack(*(g + pad), *(loc + pad), len(axes), 0)]
    for i, (kind, rank, count, split_dim, r0, r1) in enumerate(axes):
        out.append(_AXIS.pack(kind, i, rank, count, split_dim, r0, r1))
    out.append(bytes(_AXIS.size * (MAX_LAYOUT_AXES - len(axes))))
    return b"".join(out)


def tensor_header(t) -> bytes:
    """The metadata of a whole tensor t (ValueError for more than 8
    dimensions or an unknown dtype)."""
    shape = [int(x) for x in tuple(t.shape)]
    code = dtype_code(t)
    if code < 0:
        raise ValueError(f"unsupported tensor dtype {getattr(t, 'dtype', None)}")
    n = item_size(code)
    for d in shape:
        n *= d
    return build_metadata(code, shape, shape, n)


def parse_metadata(b) -> Optional[dict]:
    """The fields of a stored tensor's metadata, checked as the official
    reader checks them, or None: dtype, layout, global and local shape,
    axes (kind, rank, count, split_dim, reserved0, reserved1), offset."""
    total = len(b)
    if total < TENSOR_HEADER_SIZE:
        return None
    magic, version, hsize, code, ndim, layout, _, off, nbytes = _OBJECT.unpack_from(b, 0)
    if magic != TENSOR_MAGIC or version != 1 or hsize != TENSOR_HEADER_SIZE:
        return None
    if not 0 <= code < len(_DTYPES) or not 0 <= ndim <= MAX_TENSOR_DIMS or layout > LAYOUT_SHARD:
        return None
    if off < TENSOR_HEADER_SIZE or off > total or nbytes != total - off:
        return None
    *dims, count, _ = _SHAPES.unpack_from(b, _OBJECT.size)
    g, loc = dims[:MAX_TENSOR_DIMS], dims[MAX_TENSOR_DIMS:]
    if count > MAX_LAYOUT_AXES or any(d <= 0 for d in g[:ndim]) or any(d < 0 for d in loc[:ndim]):
        return None
    if any(d != -1 for d in g[ndim:] + loc[ndim:]):
        return None
    axes = []
    for i in range(count):
        kind, _, rank, cnt, sd, r0, r1 = _AXIS.unpack_from(b, _OBJECT.size + _SHAPES.size + i * _AXIS.size)
        if not 0 <= kind <= 4 or cnt <= 0 or not 0 <= rank < cnt or not -1 <= sd < ndim:
            return None
        axes.append((kind, rank, cnt, sd, r0, r1))
    n = item_size(code)
    for d in loc[:ndim]:
        n *= d
    if n != nbytes:
        return None
    return dict(dtype=code, layout=layout, global_shape=tuple(g[:ndim]), shape=tuple(loc[:ndim]), axes=axes,
                offset=off)


def parse_header(b) -> Optional[tuple]:
    """(dtype code, local shape, data offset) of a stored tensor, or None."""
    m = parse_metadata(b)
    return None if m is None else (m["dtype"], m["shape"], m["offset"])


def make_tensor(buf, code: int, shape: tuple, offset: int):
    """A tensor (torch when importable, else numpy) over buf's bytes from
    offset: torch.frombuffer/numpy.frombuffer share buf's memory."""
    name, np_dtype, size = _DTYPES[code]
    n = 1
    for d in shape:
        n *= d
    try:
        import torch
        t = torch.frombuffer(buf, dtype=getattr(torch, name), count=n, offset=offset) if n else \
            torch.empty(0, dtype=getattr(torch, name))
        return t.reshape(shape)
    except ImportError:
        import numpy as np
        return np.frombuffer(buf, dtype=np_dtype, count=n, offset=offset).reshape(shape)


def tensor_bytes(t):
    """(a view of the bytes of a CPU tensor or array, the object that
    owns them): uncopied where t is contiguous. Keep the owner alive while
    the view is used."""
    from mooncake_go import address
    contiguous = getattr(t, "contiguous", None)
    if callable(contiguous) and hasattr(t, "data_ptr"):
        t = contiguous()
    elif hasattr(t, "__array_interface__"):
        import numpy as np
        t = np.ascontiguousarray(t)
    addr, n = address(t)
    view = memoryview((ctypes.c_char * n).from_address(addr)).cast("B") if n else memoryview(b"")
    return view, t
