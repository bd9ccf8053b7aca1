"""Tensor layouts of the official ``mooncake.store`` beyond put_tensor:
tensors stored by parallelism (ParallelAxis, TensorParallelism,
ReadTarget and the ``*_tensor_with_parallelism*`` methods), splitting a
tensor laid out in a raw buffer (``*_tensor_with_tp_from``), safetensors
files, and client-side pools of registered buffers (BufferPool).

Objects are laid out as the official store lays them out, so that either
implementation reads what the other wrote: every value is a TensorMetadata
(``_store_ext``) then the bytes; a shard's metadata says SHARD, its
global and local shape and its axes. Shard keys, as official:

* one TP axis: ``<key>_tp_<rank>`` (what put_tensor_with_tp writes);
* other axis sets: ``<key>`` + ``__<kind>_<rank>of<size>[_sd<d>][_eid<e>][_sid<s>]``
  per axis, in the order dp, tp, ep, pp;
* a writer partition: ``<key>__writer_<rank>of<size>_sd<d>``, with the
  global shape in ``<key>__writer_manifest``.

Only uniform splits are accepted (the dimension divisible by the shard
count), as the official store requires. Tensors are torch tensors when
torch is importable and numpy arrays otherwise; any object with
``shape``, ``dtype`` and the buffer protocol (or ``data_ptr``) is written.
"""

from __future__ import annotations

import ctypes
import json
import logging
import struct
import threading
import time
from typing import List, Optional

import mooncake_go
from mooncake_go import address, errors

from . import _store_ext as _x

log = logging.getLogger("mooncake.store")

_INVALID_PARAMS = -600
_OBJECT_NOT_FOUND = -704
_FILE_ERROR = -900

# LayoutAxisKind numbers and the canonical order of axes in shard keys.
_KINDS = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}

# WriterShardManifest: u32 magic "NAMW", u16 version 1, u16 size 96, i32
# dtype, ndim, split_dim, shard_count, reserved, 4 bytes of padding, then
# the global shape (int64[8], -1 past ndim).
_MANIFEST = struct.Struct("<IHHiiiii4x8q")
_MANIFEST_MAGIC = 0x574D414E


class ParallelAxis:
    """One axis of a parallel layout: ``kind`` ("tp", "dp", "ep", "pp"),
    this shard's ``rank`` of ``size``; ``split_dim`` (tp: required, the
    dimension cut), ``expert_id`` (ep) and ``stage_id`` (pp)."""

    def __init__(self, kind: str = "", rank: int = 0, size: int = 1, split_dim: Optional[int] = None,
                 expert_id: Optional[int] = None, stage_id: Optional[int] = None):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def __repr__(self) -> str:
        return f"ParallelAxis(kind={self.kind!r}, rank={self.rank}, size={self.size}, split_dim={self.split_dim})"


class TensorParallelism:
    """The axes (ParallelAxis, at most 4, one per kind) of a shard."""

    def __init__(self, axes: Optional[list] = None):
        self.axes = list(axes or [])

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self.axes!r})"


class ReadTarget:
    """What a parallelism read returns: ``mode`` "as_stored" (the object
    as written: a shard for a parallelism, else the key), "shard" (the
    shard of ``parallelism``) or "full" (the whole tensor, joined from the
    TP shards of ``parallelism``, or from a writer partition's shards)."""

    def __init__(self, mode: str = "as_stored", parallelism: Optional[TensorParallelism] = None):
        self.mode, self.parallelism = mode, parallelism

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self.mode!r}, parallelism={self.parallelism!r})"


# -- layouts -------------------------------------------------------------------


class _Axis(tuple):
    """A checked axis: (kind number, rank, size, split_dim, expert_id,
    stage_id), None where absent."""

    kind = property(lambda a: a[0])
    rank = property(lambda a: a[1])
    size = property(lambda a: a[2])
    split_dim = property(lambda a: a[3])

    def with_rank(self, r: int) -> "_Axis":
        return _Axis((self[0], r) + self[2:])

    def layout(self, local_shape) -> tuple:
        """The stored LayoutAxis fields (the axis index is its position)."""
        extra = self[4] if self[0] == 2 else self[5] if self[0] == 3 else 0
        sd = -1 if self[3] is None else self[3]
        return self[0], self[1], self[2], sd, extra or 0, local_shape[sd] if sd >= 0 else 0

    def suffix(self) -> str:
        s = f"{_KIND_NAMES[self[0]]}_{self[1]}of{self[2]}"
        for tag, v in (("_sd", self[3]), ("_eid", self[4]), ("_sid", self[5])):
            if v is not None:
                s += f"{tag}{v}"
        return s


def _opt(v):
    return None if v is None else int(v)


def _axes(parallelism) -> List[_Axis]:
    """The checked axes of a TensorParallelism (ValueError names the
    fault, as the official validation does)."""
    if not hasattr(parallelism, "axes"):
        raise ValueError("TensorParallelism must provide axes")
    out, seen = [], set()
    for a in list(parallelism.axes):
        if not all(hasattr(a, f) for f in ("kind", "rank", "size")):
            raise ValueError("ParallelAxis must provide kind, rank, and size")
        kind = _KINDS.get(str(a.kind).lower())
        if kind is None:
            raise ValueError(f"unsupported parallel axis kind {a.kind!r}")
        ax = _Axis((kind, int(a.rank), int(a.size), _opt(getattr(a, "split_dim", None)),
                    _opt(getattr(a, "expert_id", None)), _opt(getattr(a, "stage_id", None))))
        if ax.size <= 0 or not 0 <= ax.rank < ax.size:
            raise ValueError(f"invalid rank/size for axis {a.kind}")
        if kind in seen:
            raise ValueError("duplicate axis kinds are not supported")
        seen.add(kind)
        if kind == 1 and ax.split_dim is None:
            raise ValueError("TP axis requires split_dim")
        if kind != 1 and ax.split_dim is not None:
            raise ValueError(f"{a.kind} axis must not provide split_dim")
        if kind == 2 and ax[4] is None:
            raise ValueError("EP axis requires expert_id")
        if kind == 3 and ax[5] is None:
            raise ValueError("PP axis requires stage_id")
        out.append(ax)
    if not out:
        raise ValueError("parallelism axes cannot be empty")
    if len(out) > _x.MAX_LAYOUT_AXES:
        raise ValueError("axis count exceeds max supported axes")
    return out


def _canonical(axes) -> list:
    return sorted(axes, key=lambda a: a.kind)


def _tp_index(axes) -> Optional[int]:
    return next((i for i, a in enumerate(axes) if a.kind == 1), None)


def parallelism_key(base: str, axes) -> str:
    """The key of the shard that axes describe."""
    if len(axes) == 1 and axes[0].kind == 1:
        return f"{base}_tp_{axes[0].rank}"
    return base + "".join("__" + a.suffix() for a in _canonical(axes))


def writer_key(base: str, rank: int, size: int, split_dim: int) -> str:
    return f"{base}__writer_{rank}of{size}_sd{split_dim}"


def _stored_axes(meta: dict) -> list:
    """The axes a shard's metadata records, in _Axis form."""
    out = []
    for kind, rank, cnt, sd, r0, _ in meta["axes"]:
        out.append(_Axis((kind, rank, cnt, None if sd < 0 else sd, r0 if kind == 2 else None,
                          r0 if kind == 3 else None)))
    return out


def _matches(axes, meta: dict) -> bool:
    return meta["layout"] == _x.LAYOUT_SHARD and _canonical(axes) == _canonical(_stored_axes(meta))


def _check_split(shape, split_dim: int, count: int) -> None:
    if not 0 <= split_dim < len(shape) or count <= 0:
        raise ValueError(f"split_dim {split_dim} of a {len(shape)}-dimensional tensor")
    if shape[split_dim] % count:
        raise ValueError(f"dimension {split_dim} ({shape[split_dim]}) does not split evenly into {count}")


def _split(data, code: int, shape, split_dim: int, count: int) -> list:
    """The bytes of each of count equal shards of data (a C-contiguous
    tensor's bytes of that shape) cut along split_dim: views of data where
    a shard is one run of it (nothing before split_dim but dimensions of
    1), else a copy of the shard's slabs."""
    outer = 1
    for d in shape[:split_dim]:
        outer *= d
    inner = _x.item_size(code)
    for d in shape[split_dim + 1:]:
        inner *= d
    step = shape[split_dim] // count * inner  # bytes of one shard's slab
    row = shape[split_dim] * inner
    mv = memoryview(data).cast("B")
    if outer == 1:
        return [mv[r * step:(r + 1) * step] for r in range(count)]
    return [b"".join(mv[o * row + r * step:o * row + (r + 1) * step] for o in range(outer)) for r in range(count)]


def _join(parts, global_shape, split_dim: int, code: int) -> bytes:
    """The inverse of _split: equal shards' bytes joined along split_dim."""
    outer = 1
    for d in global_shape[:split_dim]:
        outer *= d
    if outer == 0 or not parts:
        return b""
    steps = [len(p) // outer for p in parts]
    views = [memoryview(p).cast("B") for p in parts]
    return b"".join(v[o * s:(o + 1) * s] for o in range(outer) for v, s in zip(views, steps))


def _shape(t) -> tuple:
    return tuple(int(x) for x in tuple(t.shape))


def _code(t) -> int:
    c = _x.dtype_code(t)
    if c < 0:
        raise ValueError(f"unsupported tensor dtype {getattr(t, 'dtype', None)}")
    return c


def _memory(addr: int, n: int):
    return (ctypes.c_char * int(n)).from_address(int(addr))


def _rc(e: Exception) -> int:
    code = getattr(e, "code", None)
    return code if isinstance(code, int) and code < 0 else _INVALID_PARAMS


def _nbytes(p) -> int:
    return memoryview(p).nbytes


def _concat(pieces) -> bytes:
    """The pieces (bytes-like) as one value: a copy, for the paths that
    need the value in one buffer."""
    return b"".join(p if memoryview(p).c_contiguous else memoryview(p).tobytes() for p in pieces)


def _ranges(pieces) -> list:
    """(address, length, offset in the value) of each non-empty piece;
    ValueError for a piece whose memory cannot be addressed."""
    out, off = [], 0
    for p in pieces:
        n = _nbytes(p)
        if n:
            out.append((address(p)[0], n, off))
        off += n
    return out


def _whole_objects(key: str, t, keep: list) -> list:
    """The object that stores t whole: its FULL metadata, then its bytes."""
    header = _x.tensor_header(t)
    view, owner = _x.tensor_bytes(t)
    keep.append(owner)
    return [(key, [header, view])]


def _shard_objects(base: str, shape, code: int, data, axes) -> list:
    """The objects of every rank of the TP axis among axes: each shard of
    data (a whole tensor's bytes, of shape) under its key, with SHARD
    metadata (global and local shape, the axes with this rank)."""
    ti = _tp_index(axes)
    tp = axes[ti]
    _check_split(shape, tp.split_dim, tp.size)
    local = list(shape)
    local[tp.split_dim] //= tp.size
    out = []
    for r, part in enumerate(_split(data, code, shape, tp.split_dim, tp.size)):
        ax = list(axes)
        ax[ti] = tp.with_rank(r)
        meta = _x.build_metadata(code, shape, local, _nbytes(part), _x.LAYOUT_SHARD, [a.layout(local) for a in ax])
        out.append((parallelism_key(base, ax), [meta, part]))
    return out


def _tensor_objects(key: str, t, axes, keep: list) -> list:
    """The objects that store t: whole (axes None), every TP rank's
    shard (a TP axis), or t as the one shard axes name. ValueError names
    what is wrong with t or the split."""
    if axes is None:
        return _whole_objects(key, t, keep)
    code, shape = _code(t), _shape(t)
    view, owner = _x.tensor_bytes(t)
    keep.append(owner)
    if _tp_index(axes) is not None:
        return _shard_objects(key, shape, code, view, axes)
    meta = _x.build_metadata(code, shape, shape, _nbytes(view), _x.LAYOUT_SHARD, [a.layout(shape) for a in axes])
    return [(parallelism_key(key, axes), [meta, view])]


# -- the store methods ---------------------------------------------------------


class TensorExt:
    """MooncakeDistributedStore's parallelism, tp_from and safetensors
    methods (a mixin over its put/upsert/get_buffer)."""

    # writes: every write resolves to objects, each a key and the pieces
    # of its value (a TensorMetadata, then views of the tensor's bytes),
    # stored by _write_values without joining them in Python.

    def _write_values(self, keys: List[str], values: List[list], config, upsert: bool) -> List[int]:
        """Stores the concatenation of the pieces values[i] (bytes-like)
        under keys[i]; 0 or a negative code per key. A put goes through a
        put session, which writes each piece from where it lies (registered
        memory directly, other memory through the staging buffer). An
        upsert, a key the session refuses (one that exists: the ordinary
        put answers, write-once) and a library before ABI 1.4 take the
        ordinary path, which needs each value in one buffer."""
        codes: List[Optional[int]] = [None] * len(keys)
        if not upsert and keys and mooncake_go.Store.supports("put_sessions"):
            self._write_sessions(keys, values, config, codes)
        rest = [i for i, c in enumerate(codes) if c is None]
        if rest:
            got = self._batch_put([keys[i] for i in rest], [_concat(values[i]) for i in rest], config, upsert)
            for i, c in zip(rest, got):
                codes[i] = c
        return codes

    def _write_sessions(self, keys, values, config, codes) -> None:
        """The put sessions of _write_values: sets codes[i] for the keys
        it stored or failed, leaves None for the ordinary path."""
        try:
            ranges = [_ranges(ps) for ps in values]
            st = self._s()
            started = st.put_session_start(keys, [sum(n for _, n, _ in r) for r in ranges],
                                           None if config is None else config._native())
        except (ValueError, TypeError, errors.MooncakeError):
            return
        live = [i for i, r in enumerate(started) if r is None]
        try:
            if live:
                wrote = st.batch_put_ranges([keys[i] for i in live],
                                            [[(o, a, n) for a, n, o in ranges[i]] for i in live])
                for i, r in zip(live, wrote):
                    codes[i] = _rc(r) if isinstance(r, errors.MooncakeError) else None
                done = [i for i in live if codes[i] is None]
                if done:
                    for i, r in zip(done, st.put_session_end([keys[i] for i in done])):
                        codes[i] = 0 if r is None else _rc(r)
        except errors.MooncakeError as e:
            for i in live:
                if codes[i] is None:
                    codes[i] = _rc(e)
        # A session that did not end gives its room back.
        failed = [keys[i] for i in live if codes[i] != 0]
        if failed:
            try:
                st.put_session_revoke(failed)
            except errors.MooncakeError as e:
                log.warning("revoking the put sessions of %d keys: %s", len(failed), e)

    def _write_groups(self, groups: list, config, upsert: bool) -> List[int]:
        """groups[i] is the objects (key, pieces) of input i, or its code
        when it has none; 0 or the first failing object's code per input."""
        keys, values, owner = [], [], []
        for gi, g in enumerate(groups):
            if not isinstance(g, int):
                for k, ps in g:
                    keys.append(k)
                    values.append(ps)
                    owner.append(gi)
        out = [g if isinstance(g, int) else 0 for g in groups]
        for gi, c in zip(owner, self._write_values(keys, values, config, upsert)):
            if c != 0 and out[gi] == 0:
                out[gi] = c
        return out

    def _write_tensors(self, keys, tensors, axes_list, config, upsert: bool, what: str) -> List[int]:
        """Stores tensors[i] under keys[i]: whole (axes None) or as the
        shards axes_list[i] describe; 0 or a negative code per key."""
        if len(tensors) != len(keys) or len(axes_list) != len(keys):
            log.error("%s: keys and tensors differ in length", what)
            return [_INVALID_PARAMS] * len(keys)
        keep, groups = [], []  # keep: the tensors' owners, alive until written
        for k, t, axes in zip(keys, tensors, axes_list):
            try:
                groups.append(_tensor_objects(k, t, axes, keep))
            except (ValueError, TypeError, AttributeError) as e:
                log.error("%s %r: %s", what, k, e)
                groups.append(_INVALID_PARAMS)
        return self._write_groups(groups, config, upsert)

    def _write_tp(self, keys, tensors, config, tp_size, split_dim, upsert: bool = False) -> List[int]:
        """The *_tensor_with_tp writes: every rank's shard of each tensor
        (SHARD metadata with one TP axis) under <key>_tp_<rank>; a
        tp_size of 1 or less stores the tensor whole under its key, as
        the official store does."""
        tp_size, split_dim = int(tp_size), int(split_dim)
        axes = None if tp_size <= 1 else [_Axis((1, 0, tp_size, split_dim, None, None))]
        return self._write_tensors(keys, tensors, [axes] * len(keys), config, upsert, "put tensor with tp")

    def _write_parallel(self, key, t, parallelism, config, writer_partition, upsert) -> int:
        try:
            if writer_partition is not None:
                if parallelism is not None:
                    raise ValueError("writer_partition cannot be combined with parallelism")
                return self._write_writer_shard(key, t, writer_partition, config, upsert)
            axes = None if parallelism is None else _axes(parallelism)
        except (ValueError, TypeError, AttributeError) as e:
            log.error("put tensor %r with parallelism: %s", key, e)
            return _INVALID_PARAMS
        return self._write_tensors([key], [t], [axes], config, upsert, "put tensor with parallelism")[0]

    def _write_writer_shard(self, key, t, w, config, upsert) -> int:
        if not all(hasattr(w, f) for f in ("rank", "size", "split_dim")):
            raise ValueError("writer_partition must provide rank, size, and split_dim")
        rank, size, sd = int(w.rank), int(w.size), int(w.split_dim)
        if size <= 0 or not 0 <= rank < size or sd < 0:
            raise ValueError("invalid writer partition")
        code, shape = _code(t), _shape(t)
        _check_split(shape, sd, size)
        view, _keep = _x.tensor_bytes(t)
        part = _split(view, code, shape, sd, size)[rank]
        local = list(shape)
        local[sd] //= size
        axis = _Axis((1, rank, size, sd, None, None))
        meta = _x.build_metadata(code, shape, local, _nbytes(part), _x.LAYOUT_SHARD, [axis.layout(local)])
        rc = self._write_values([writer_key(key, rank, size, sd)], [[meta, part]], config, upsert)[0]
        if rc != 0:
            return rc
        pad = [-1] * (_x.MAX_TENSOR_DIMS - len(shape))
        manifest = _MANIFEST.pack(_MANIFEST_MAGIC, 1, _MANIFEST.size, code, len(shape), sd, size, 0,
                                  *(list(shape) + pad))
        return self.upsert(f"{key}__writer_manifest", manifest, config)

    def put_tensor_with_parallelism(self, key: str, tensor, parallelism=None, config=None,
                                    writer_partition=None) -> int:
        """Stores tensor whole (no parallelism), as the shards of its TP
        axis (a TP axis: tensor is the whole tensor, every TP rank is
        written), as the shard parallelism names (no TP axis), or as this
        writer's part (writer_partition: rank, size, split_dim)."""
        return self._write_parallel(key, tensor, parallelism, config, writer_partition, False)

    def upsert_tensor_with_parallelism(self, key: str, tensor, parallelism=None, config=None,
                                       writer_partition=None) -> int:
        return self._write_parallel(key, tensor, parallelism, config, writer_partition, True)

    def _decode(self, buffer_ptr, size):
        """The tensor laid out at buffer_ptr (metadata then data); ValueError
        when it is not one."""
        buf = _memory(buffer_ptr, size)
        meta = _x.parse_metadata(buf)
        if meta is None:
            raise ValueError("the buffer is not a stored tensor (metadata, then data)")
        return _x.make_tensor(buf, meta["dtype"], meta["shape"], meta["offset"])

    def _write_parallel_from(self, key, buffer_ptr, size, parallelism, config, writer_partition, upsert) -> int:
        try:
            t = self._decode(buffer_ptr, size)
        except (ValueError, TypeError) as e:
            log.error("put tensor %r from a buffer: %s", key, e)
            return _INVALID_PARAMS
        return self._write_parallel(key, t, parallelism, config, writer_partition, upsert)

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism=None,
                                         config=None, writer_partition=None) -> int:
        """put_tensor_with_parallelism of the tensor laid out in the buffer
        (metadata then data, as get_tensor_into leaves it)."""
        return self._write_parallel_from(key, buffer_ptr, size, parallelism, config, writer_partition, False)

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: int, size: int, parallelism=None,
                                            config=None, writer_partition=None) -> int:
        return self._write_parallel_from(key, buffer_ptr, size, parallelism, config, writer_partition, True)

    @staticmethod
    def _requests(keys, reqs, name):
        if reqs is None:
            return [None] * len(keys)
        if not isinstance(reqs, list) or len(reqs) != len(keys):
            raise ValueError(f"{name} must be a list as long as keys")
        return reqs

    def _batch_parallel(self, keys, values, parallelisms, config, writer_partitions, upsert, one) -> List[int]:
        try:
            if len(values) != len(keys):
                raise ValueError("keys and values differ in length")
            if parallelisms is not None and writer_partitions is not None:
                raise ValueError("writer_partitions cannot be combined with parallelisms")
            ps = self._requests(keys, parallelisms, "parallelisms")
            ws = self._requests(keys, writer_partitions, "writer_partitions")
        except ValueError as e:
            log.error("batch tensor write: %s", e)
            return [_INVALID_PARAMS] * len(keys)
        return [one(k, v, p, config, w, upsert) for k, v, p, w in zip(keys, values, ps, ws)]

    def batch_put_tensor_with_parallelism(self, keys: List[str], tensors_list: List, parallelisms=None,
                                          config=None, writer_partitions=None) -> List[int]:
        return self._batch_parallel(keys, tensors_list, parallelisms, config, writer_partitions, False,
                                    self._write_parallel)

    def batch_upsert_tensor_with_parallelism(self, keys: List[str], tensors_list: List, parallelisms=None,
                                             config=None, writer_partitions=None) -> List[int]:
        return self._batch_parallel(keys, tensors_list, parallelisms, config, writer_partitions, True,
                                    self._write_parallel)

    def _batch_parallel_from(self, keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, upsert):
        if len(sizes) != len(keys):
            return [_INVALID_PARAMS] * len(keys)
        one = lambda k, ps, p, c, w, u: self._write_parallel_from(k, ps[0], ps[1], p, c, w, u)  # noqa: E731
        return self._batch_parallel(keys, list(zip(buffer_ptrs, sizes)), parallelisms, config,
                                    writer_partitions, upsert, one)

    def batch_put_tensor_with_parallelism_from(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                               parallelisms=None, config=None, writer_partitions=None) -> List[int]:
        return self._batch_parallel_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, False)

    def batch_upsert_tensor_with_parallelism_from(self, keys: List[str], buffer_ptrs: List[int],
                                                  sizes: List[int], parallelisms=None, config=None,
                                                  writer_partitions=None) -> List[int]:
        return self._batch_parallel_from(keys, buffer_ptrs, sizes, parallelisms, config, writer_partitions, True)

    # reads: each resolves to (metadata, value bytes) of the result

    def _load(self, key):
        h = self.get_buffer(key)
        if not h:
            return None
        meta = _x.parse_metadata(h)
        return None if meta is None else (meta, h)

    def _load_shard(self, key, axes):
        got = self._load(parallelism_key(key, axes))
        if got is not None and _matches(axes, got[0]):
            return got
        if len(axes) == 1 and axes[0].kind == 1:  # a writer partition's shard serves a TP read
            a = axes[0]
            got = self._load(writer_key(key, a.rank, a.size, a.split_dim))
            if got is not None and _matches(axes, got[0]):
                return got
        return None

    def _full(self, code, global_shape, parts, split_dim):
        data = _join(parts, global_shape, split_dim, code)
        meta = _x.build_metadata(code, global_shape, global_shape, len(data))
        return _x.parse_metadata(meta + data), bytearray(meta + data)

    def _load_full(self, key, axes):
        ti = _tp_index(axes) if axes else None
        if axes is None:
            got = self._load(key)
            if got is not None:
                return got if got[0]["layout"] == _x.LAYOUT_FULL else None
            return self._load_writer_full(key)
        if ti is None:
            raise ValueError("a full read needs a TP axis")
        tp = axes[ti]
        parts, first = [], None
        for r in range(tp.size):
            ax = list(axes)
            ax[ti] = tp.with_rank(r)
            got = self._load_shard(key, ax)
            if got is None:
                return None
            meta = got[0]
            if first is None:
                first = meta
            elif (meta["dtype"], meta["global_shape"]) != (first["dtype"], first["global_shape"]):
                raise ValueError(f"shard {r} of {key!r} disagrees with shard 0 in dtype or global shape")
            parts.append(memoryview(got[1])[meta["offset"]:])
        return self._full(first["dtype"], first["global_shape"], parts, tp.split_dim)

    def _load_writer_full(self, key):
        raw = self.get_buffer(f"{key}__writer_manifest")
        if not raw or len(raw) < _MANIFEST.size:
            return None
        magic, version, hsize, code, ndim, sd, count, _, *dims = _MANIFEST.unpack_from(raw, 0)
        if magic != _MANIFEST_MAGIC or version != 1 or hsize != _MANIFEST.size or not 0 <= sd < ndim:
            return None
        gshape = tuple(dims[:ndim])
        parts = []
        for r in range(count):
            got = self._load(writer_key(key, r, count, sd))
            if got is None or got[0]["global_shape"] != gshape or got[0]["dtype"] != code:
                return None
            parts.append(memoryview(got[1])[got[0]["offset"]:])
        return self._full(code, gshape, parts, sd)

    def _resolve(self, key, target):
        mode = "as_stored" if target is None else str(getattr(target, "mode", "")).lower()
        if target is not None and not hasattr(target, "parallelism"):
            raise ValueError("ReadTarget must provide mode and parallelism")
        p = None if target is None else target.parallelism
        axes = None if p is None else _axes(p)
        if mode == "full":
            return self._load_full(key, axes)
        if mode not in ("as_stored", "shard"):
            raise ValueError(f"unsupported ReadTarget mode {target.mode!r}")
        if axes is None:
            if mode == "shard":
                raise ValueError("a shard read needs a parallelism")
            return self._load(key)
        return self._load_shard(key, axes)

    def get_tensor_with_parallelism(self, key: str, target=None):
        """The tensor target asks for (ReadTarget; None: the key as
        stored), or None when it is missing or does not match."""
        try:
            got = self._resolve(key, target)
        except ValueError as e:
            log.error("get tensor %r: %s", key, e)
            return None
        if got is None:
            return None
        meta, buf = got
        return _x.make_tensor(buf, meta["dtype"], meta["shape"], meta["offset"])

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: int, size: int, target=None):
        """As get_tensor_with_parallelism, laid out in the buffer (metadata
        then data); the tensor shares the buffer. None when missing or
        when it does not fit."""
        try:
            got = self._resolve(key, target)
        except ValueError as e:
            log.error("get tensor %r: %s", key, e)
            return None
        if got is None:
            return None
        meta, buf = got
        if len(buf) > int(size):
            log.error("get tensor %r into a buffer of %d bytes: it needs %d", key, size, len(buf))
            return None
        ctypes.memmove(int(buffer_ptr), bytes(buf), len(buf))
        return _x.make_tensor(_memory(buffer_ptr, len(buf)), meta["dtype"], meta["shape"], meta["offset"])

    def batch_get_tensor_with_parallelism(self, keys: List[str], targets=None) -> list:
        try:
            ts = self._requests(keys, targets, "targets")
        except ValueError as e:
            log.error("batch get tensor: %s", e)
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism(k, t) for k, t in zip(keys, ts)]

    def batch_get_tensor_with_parallelism_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                               targets=None) -> list:
        try:
            ts = self._requests(keys, targets, "targets")
            if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
                raise ValueError("keys, buffer_ptrs and sizes differ in length")
        except ValueError as e:
            log.error("batch get tensor into: %s", e)
            return [None] * len(keys)
        return [self.get_tensor_with_parallelism_into(k, p, n, t)
                for k, p, n, t in zip(keys, buffer_ptrs, sizes, ts)]

    # a whole tensor in a raw buffer, split for tensor parallelism

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> int:
        """Splits the whole tensor laid out in the buffer (metadata then
        data) into tp_size equal shards along split_dim and stores every
        rank's shard under <key>_tp_<rank> (the key itself for tp_size 1),
        as put_tensor_with_tp does; tp_rank is not used."""
        try:
            tp_size, split_dim = int(tp_size), int(split_dim)
            buf = _memory(buffer_ptr, size)
            meta = _x.parse_metadata(buf)
            if meta is None or meta["layout"] != _x.LAYOUT_FULL:
                raise ValueError("the buffer is not a whole stored tensor (metadata, then data)")
            if tp_size == 1:
                return self.put(key, buf, None)
            data = memoryview(buf).cast("B")[meta["offset"]:]
            axes = [_Axis((1, 0, tp_size, split_dim, None, None))]
            objects = _shard_objects(key, meta["shape"], meta["dtype"], data, axes)
        except (ValueError, TypeError) as e:
            log.error("put_tensor_with_tp_from %r: %s", key, e)
            return _INVALID_PARAMS
        return self._write_groups([objects], None, False)[0]

    def batch_put_tensor_with_tp_from(self, base_keys: List[str], buffer_ptrs: List[int], sizes: List[int],
                                      tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> List[int]:
        if len(buffer_ptrs) != len(base_keys) or len(sizes) != len(base_keys):
            return [_INVALID_PARAMS] * len(base_keys)
        return [self.put_tensor_with_tp_from(k, p, n, tp_rank, tp_size, split_dim)
                for k, p, n in zip(base_keys, buffer_ptrs, sizes)]

    # safetensors files

    def save_tensor_to_safetensor(self, key: str, file_name=None) -> int:
        """Writes the tensor stored under key to a safetensors file
        (file_name, else the key) as a tensor named key; 0 or a negative
        code."""
        got = self._load(key)
        if got is None:
            log.error("save_tensor_to_safetensor: no tensor under %r", key)
            return _OBJECT_NOT_FOUND
        meta, buf = got
        try:
            write_safetensors(str(file_name or key), key, meta["dtype"], meta["shape"],
                              memoryview(buf)[meta["offset"]:])
        except OSError as e:
            log.error("save_tensor_to_safetensor %r: %s", key, e)
            return _FILE_ERROR
        return 0

    def load_tensor_from_safetensor(self, key=None, file_name: str = None):
        """Reads the tensor named key (else the file's first, with a
        warning) from the safetensors file file_name, stores it under key
        (file_name when key is None) and returns it; None on failure."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() needs file_name")
        store_key = file_name if key is None else str(key)
        try:
            name, code, shape, data = read_safetensors(str(file_name), store_key)
        except (OSError, ValueError) as e:
            log.error("Failed to load tensor from safetensor file %s: %s", file_name, e)
            return None
        n = len(data)
        value = bytearray(_x.build_metadata(code, shape, shape, n) + data)
        if self.put(store_key, value, None) != 0:
            return None
        return _x.make_tensor(value, code, shape, _x.TENSOR_HEADER_SIZE)


# -- safetensors: u64 LE header length, a JSON header, then the data -----------

_ST_DTYPES = ["F32", "F64", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL", "F16", "BF16",
              "F8_E4M3", "F8_E5M2"]
_ST_MAX_HEADER = 100 << 20


def write_safetensors(path: str, name: str, code: int, shape, data) -> None:
    header = {name: {"dtype": _ST_DTYPES[code], "shape": list(shape), "data_offsets": [0, len(data)]}}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data starts 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.write(data)


def read_safetensors(path: str, name: str) -> tuple:
    """(name, dtype code, shape, bytes) of the tensor name in the file, or
    of its first tensor (by offset) when it has no such name; ValueError
    for a malformed file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("not a safetensors file (shorter than its header length)")
    (n,) = struct.unpack_from("<Q", raw, 0)
    if n > min(_ST_MAX_HEADER, len(raw) - 8):
        raise ValueError(f"header length {n} runs past the file")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ValueError(f"bad safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError("bad safetensors header: not an object")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if not tensors:
        raise ValueError("no tensors in the file")
    if name not in tensors:
        first = min(tensors, key=lambda k: tensors[k].get("data_offsets", [0])[0])
        log.warning("tensor %r not found in safetensor file %s; using first entry %r", name, path, first)
        name = first
    info = tensors[name]
    try:
        code = _ST_DTYPES.index(info["dtype"])
        shape = tuple(int(d) for d in info["shape"])
        lo, hi = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"bad entry for {name!r}: {e}") from None
    count = _x.item_size(code)
    for d in shape:
        count *= d
    base = 8 + n
    if not 0 <= lo <= hi or base + hi > len(raw) or hi - lo != count:
        raise ValueError(f"data offsets [{lo}, {hi}) of {name!r} do not fit shape {shape} or the file")
    return name, code, shape, raw[base + lo:base + hi]


# -- buffer pools --------------------------------------------------------------


class BufferLeaseView:
    """The bytes of a lease, writable: ``buffer`` is a memoryview of them."""

    def __init__(self, ptr: int, size: int):
        self._arr = _memory(ptr, size) if size else (ctypes.c_char * 0)()

    @property
    def buffer(self) -> memoryview:
        return memoryview(self._arr).cast("B")

    def __len__(self) -> int:
        return len(self._arr)


class BufferLease:
    """size bytes at ptr of a pool's registered memory until release()
    (or the end of a ``with`` block)."""

    def __init__(self, pool: "BufferPool", ptr: int, size: int, cls: int):
        self._pool, self._ptr, self._size, self._cls = pool, ptr, size, cls

    @property
    def ptr(self) -> int:
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def buffer(self) -> BufferLeaseView:
        if self._pool is None:
            raise RuntimeError("the lease was released")
        return BufferLeaseView(self._ptr, self._size)

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._give_back(self._ptr, self._cls)

    def __enter__(self) -> "BufferLease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class BufferPool:
    """Buffers registered with a MooncakeDistributedStore, handed out as
    leases and reused: sizes round up to a power-of-two class of at least
    min_size_class (at most max_size_class), each class keeps its free
    buffers. max_bytes caps what the pool holds (0: no cap), max_regions
    the number of buffers; when a lease cannot be had, acquire waits for a
    release (block_on_exhaustion, up to timeout / default_timeout seconds,
    then TimeoutError) or raises MemoryError at once. The official pool's
    alignment is that of its regions: here every buffer is its own
    page-aligned mapping."""

    def __init__(self, store: object, max_bytes: int = 0, min_size_class: int = 65536, max_size_class=None,
                 alignment: int = 8388608, block_on_exhaustion: bool = True, default_timeout=None,
                 max_regions=None, prewarm_size=None, prewarm_count: int = 0):
        if store is None or not hasattr(store, "register_buffer"):
            raise TypeError("BufferPool needs a MooncakeDistributedStore")
        if int(min_size_class) <= 0 or int(max_bytes) < 0 or int(alignment) <= 0:
            raise ValueError("min_size_class and alignment must be positive, max_bytes not negative")
        self._store = store
        self._max_bytes = int(max_bytes)
        self._min = int(min_size_class)
        self._max_class = None if max_size_class is None else int(max_size_class)
        self._block = bool(block_on_exhaustion)
        self._timeout = default_timeout
        self._max_regions = None if max_regions is None else int(max_regions)
        self._alloc = _x.MooncakeHostMemAllocator()
        self._free = {}  # class size -> [ptr]
        self._held = 0  # bytes of every buffer the pool holds
        self._regions = {}  # ptr -> class size
        self._cond = threading.Condition()
        self._closed = False
        if prewarm_size is not None and int(prewarm_count) > 0:
            self.prewarm(int(prewarm_size), int(prewarm_count))

    def _class(self, size: int) -> int:
        if size <= 0:
            raise ValueError(f"lease size {size}: must be positive")
        c = self._min
        while c < size:
            c <<= 1
        if self._max_class is not None and c > self._max_class:
            if size > self._max_class:
                raise ValueError(f"lease size {size} exceeds max_size_class {self._max_class}")
            c = self._max_class
        return c

    def _new(self, c: int) -> Optional[int]:
        """A fresh registered buffer of class c, or None at a limit."""
        if self._max_bytes and self._held + c > self._max_bytes:
            return None
        if self._max_regions is not None and len(self._regions) >= self._max_regions:
            return None
        p = self._alloc.alloc(c)
        if not p:
            raise MemoryError(f"cannot map {c} bytes for the buffer pool")
        rc = self._store.register_buffer(p, c)
        if rc != 0:
            self._alloc.free(p)
            raise RuntimeError(f"register_buffer of a {c}-byte pool buffer failed: {rc}")
        self._held += c
        self._regions[p] = c
        return p

    def _evict_other(self, c: int) -> bool:
        """Frees one idle buffer of another class to make room."""
        for k, ptrs in self._free.items():
            if k != c and ptrs:
                p = ptrs.pop()
                self._drop(p)
                return True
        return False

    def _drop(self, p: int) -> None:
        c = self._regions.pop(p)
        self._store.unregister_buffer(p)
        self._alloc.free(p)
        self._held -= c

    def acquire(self, size: int, block=None, timeout=None) -> BufferLease:
        size = int(size)
        c = self._class(size)
        block = self._block if block is None else bool(block)
        timeout = self._timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the buffer pool is closed")
                free = self._free.get(c)
                if free:
                    return BufferLease(self, free.pop(), size, c)
                p = self._new(c)
                if p is None and self._evict_other(c):
                    p = self._new(c)
                if p is not None:
                    return BufferLease(self, p, size, c)
                if not block:
                    raise MemoryError(f"buffer pool exhausted: no {c}-byte buffer free")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no {c}-byte buffer was released within {timeout} s")
                self._cond.wait(left)

    buffer = acquire

    def prewarm(self, size: int, count: int) -> None:
        """Registers count idle buffers of size's class now."""
        c = self._class(int(size))
        with self._cond:
            for _ in range(int(count)):
                p = self._new(c)
                if p is None:
                    break
                self._free.setdefault(c, []).append(p)

    def _give_back(self, p: int, c: int) -> None:
        with self._cond:
            if self._closed:
                self._drop(p)
            else:
                self._free.setdefault(c, []).append(p)
            self._cond.notify_all()

    def close(self) -> None:
        """Unregisters and frees the idle buffers; leased ones go when
        released."""
        with self._cond:
            self._closed = True
            for ptrs in self._free.values():
                for p in ptrs:
                    self._drop(p)
            self._free.clear()
            self._cond.notify_all()


# The official module names its registered pools apart; they are one class.
RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView

__all__ = ["ParallelAxis", "TensorParallelism", "ReadTarget", "BufferPool", "BufferLease", "BufferLeaseView",
           "RegisteredBufferPool", "RegisteredBufferLease", "RegisteredBufferLeaseView"]
