"""tensor_ext: the official mooncake.store tensor layouts beyond put_tensor
(ParallelAxis/TensorParallelism/ReadTarget and the *_with_parallelism*
methods, put_tensor_with_tp_from, safetensors files) and the client-side
BufferPool, against a real store (numpy as the tensor; torch where
installed). The stored bytes are checked against the official layout: a
304-byte TensorMetadata then the data, shards under the official keys."""

from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import uuid

import pytest

import mooncake.store as ms
from mooncake.store import (BufferPool, MooncakeDistributedStore, ParallelAxis, ReadTarget, RegisteredBufferPool,
                            TensorParallelism)

from conftest import LOCAL_BUFFER, SEGMENT, numpy_or_skip

META = 304
OBJ = struct.Struct("<IHHiiIIQQ")


@pytest.fixture
def store(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", master) == 0
    yield s
    assert s.close() == 0


def uid() -> str:
    return uuid.uuid4().hex


def arr(t):
    import numpy as np
    return np.asarray(t)


def tp(rank, size, split_dim):
    return TensorParallelism([ParallelAxis("tp", rank, size, split_dim)])


def layout(raw):
    """(dtype, ndim, layout kind, global shape, local shape, axes) of a
    stored value, read as the official TensorMetadata."""
    magic, version, size, dtype, ndim, kind, _, off, nbytes = OBJ.unpack_from(raw, 0)
    assert (magic, version, size, off, nbytes) == (0x4D4F4F4E, 1, META, META, len(raw) - META)
    dims = struct.unpack_from("<8q8qII", raw, 40)
    axes = [struct.unpack_from("<6iq", raw, 176 + 32 * i) for i in range(dims[16])]
    return dtype, ndim, kind, dims[:ndim], dims[8:8 + ndim], axes


def test_tensor_ext_metadata_size_is_official(official_python):
    """Our TensorMetadata is the size the official 0.3.13.post1 module
    reports (the 40-byte header of older Mooncake is not what it reads)."""
    from mooncake import _store_ext as x
    r = subprocess.run([official_python, "-c", "import mooncake.store as s; print(s._tensor_metadata_size())"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    assert int(r.stdout.strip().splitlines()[-1]) == x.TENSOR_HEADER_SIZE == META


def test_tensor_ext_tp_parallelism_shards_and_full(store):
    np = numpy_or_skip()
    m = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    key = uid()
    assert store.put_tensor_with_parallelism(key, m, tp(0, 4, 0)) == 0
    # Every TP rank's shard, under <key>_tp_<rank>, with SHARD metadata.
    for r in range(4):
        raw = store.get(f"{key}_tp_{r}")
        dtype, ndim, kind, g, loc, axes = layout(raw)
        assert (dtype, ndim, kind, g, loc) == (0, 2, 1, (8, 3), (2, 3))
        assert axes == [(1, 0, r, 4, 0, 0, 2)]  # tp, index 0, rank r of 4, split 0, local extent 2
        assert raw[META:] == m[2 * r:2 * r + 2].tobytes()
    assert store.is_exist(key) == 0  # no whole object
    # SHARD and AS_STORED read one shard; FULL joins them.
    t = store.get_tensor_with_parallelism(key, ReadTarget("shard", tp(2, 4, 0)))
    assert arr(t).tolist() == m[4:6].tolist()
    t = store.get_tensor_with_parallelism(key, ReadTarget("as_stored", tp(3, 4, 0)))
    assert arr(t).tolist() == m[6:8].tolist()
    full = store.get_tensor_with_parallelism(key, ReadTarget("full", tp(0, 4, 0)))
    assert arr(full).tobytes() == m.tobytes() and tuple(full.shape) == (8, 3)
    # split along dimension 1, into a buffer
    key2 = uid()
    c = np.arange(2 * 6, dtype=np.int16).reshape(2, 6)
    assert store.upsert_tensor_with_parallelism(key2, c, tp(0, 3, 1)) == 0
    assert arr(store.get_tensor_with_parallelism(key2, ReadTarget("shard", tp(1, 3, 1)))).tolist() == \
        c[:, 2:4].tolist()
    buf = ctypes.create_string_buffer(4096)
    got = store.get_tensor_with_parallelism_into(key2, ctypes.addressof(buf), len(buf),
                                                 ReadTarget("full", tp(0, 3, 1)))
    assert arr(got).tolist() == c.tolist()
    assert layout(buf.raw[:META + c.nbytes])[2:5] == (0, (2, 6), (2, 6))  # a FULL object in the buffer
    # Negative controls: a layout that was not written, a wrong split,
    # a missing key, an uneven split, a split dim out of range.
    assert store.get_tensor_with_parallelism(key, ReadTarget("shard", tp(1, 4, 1))) is None
    assert store.get_tensor_with_parallelism(key, ReadTarget("full", tp(0, 2, 0))) is None
    assert store.get_tensor_with_parallelism(uid(), ReadTarget("full", tp(0, 4, 0))) is None
    assert store.get_tensor_with_parallelism_into(key2, ctypes.addressof(buf), META, ReadTarget("full", tp(0, 3, 1))) \
        is None  # too small
    assert store.put_tensor_with_parallelism(uid(), m, tp(0, 3, 0)) == -600
    assert store.put_tensor_with_parallelism(uid(), m, tp(0, 2, 2)) == -600
    assert store.get_tensor_with_parallelism(key, ReadTarget("sideways", tp(0, 4, 0))) is None


def test_tensor_ext_multi_axis_and_validation(store):
    np = numpy_or_skip()
    x = np.arange(4 * 2, dtype=np.int32).reshape(4, 2)
    key = uid()
    p = TensorParallelism([ParallelAxis("ep", 1, 2, expert_id=7), ParallelAxis("tp", 0, 2, 0)])
    assert store.put_tensor_with_parallelism(key, x, p) == 0
    # Keys in canonical order (tp before ep), one per TP rank.
    for r in range(2):
        raw = store.get(f"{key}__tp_{r}of2_sd0__ep_1of2_eid7")
        assert raw[META:] == x[2 * r:2 * r + 2].tobytes()
        kinds = [a[0] for a in layout(raw)[5]]
        assert kinds == [2, 1]  # as given: ep then tp
    q = TensorParallelism([ParallelAxis("tp", 1, 2, 0), ParallelAxis("ep", 1, 2, expert_id=7)])
    assert arr(store.get_tensor_with_parallelism(key, ReadTarget("shard", q))).tolist() == x[2:].tolist()
    assert arr(store.get_tensor_with_parallelism(key, ReadTarget("full", q))).tolist() == x.tolist()
    other = TensorParallelism([ParallelAxis("ep", 1, 2, expert_id=8), ParallelAxis("tp", 1, 2, 0)])
    assert store.get_tensor_with_parallelism(key, ReadTarget("shard", other)) is None
    # No TP axis: the tensor is stored as this shard.
    dp = TensorParallelism([ParallelAxis("dp", 1, 4)])
    assert store.put_tensor_with_parallelism(key, x, dp) == 0
    assert arr(store.get(f"{key}__dp_1of4")[META:]).tobytes() == x.tobytes()
    assert arr(store.get_tensor_with_parallelism(key, ReadTarget("as_stored", dp))).tolist() == x.tolist()
    # Invalid requests, each refused as the official validation refuses it.
    bad = [
        TensorParallelism([]),                                               # no axes
        TensorParallelism([ParallelAxis("xp", 0, 2)]),                        # unknown kind
        TensorParallelism([ParallelAxis("tp", 0, 2)]),                        # tp without split_dim
        TensorParallelism([ParallelAxis("dp", 2, 2)]),                        # rank out of range
        TensorParallelism([ParallelAxis("ep", 0, 2)]),                        # ep without expert_id
        TensorParallelism([ParallelAxis("dp", 0, 2), ParallelAxis("dp", 1, 2)]),  # duplicate kind
    ]
    for b in bad:
        assert store.put_tensor_with_parallelism(uid(), x, b) == -600, b
    # no parallelism: a whole tensor, read as stored
    k3 = uid()
    assert store.put_tensor_with_parallelism(k3, x) == 0
    assert arr(store.get_tensor_with_parallelism(k3)).tolist() == x.tolist()
    assert arr(store.get_tensor(k3)).tolist() == x.tolist()
    assert store.get_tensor_with_parallelism(uid()) is None


def test_tensor_ext_writer_partitions_and_batches(store):
    np = numpy_or_skip()
    w = np.arange(6 * 2, dtype=np.float64).reshape(6, 2)
    key = uid()

    class Part:
        def __init__(self, rank, size, split_dim):
            self.rank, self.size, self.split_dim = rank, size, split_dim

    # Three writers each store their part of the same tensor.
    for r in range(3):
        assert store.put_tensor_with_parallelism(key, w, writer_partition=Part(r, 3, 0)) == 0
    assert store.get(f"{key}__writer_1of3_sd0")[META:] == w[2:4].tobytes()
    assert arr(store.get_tensor_with_parallelism(key, ReadTarget("full"))).tolist() == w.tolist()
    # a TP shard read is served by the writer's shard
    assert arr(store.get_tensor_with_parallelism(key, ReadTarget("shard", tp(2, 3, 0)))).tolist() == w[4:].tolist()
    assert store.put_tensor_with_parallelism(uid(), w, tp(0, 3, 0), writer_partition=Part(0, 3, 0)) == -600
    # a missing writer part: no full tensor
    k2 = uid()
    assert store.put_tensor_with_parallelism(k2, w, writer_partition=Part(0, 2, 0)) == 0
    assert store.get_tensor_with_parallelism(k2, ReadTarget("full")) is None
    # batches, and the _from forms over a buffer laid out by get_tensor_into
    keys = [uid(), uid()]
    ts = [np.arange(4, dtype=np.uint8), np.arange(6, dtype=np.int64).reshape(2, 3)]
    assert store.batch_put_tensor_with_parallelism(keys, ts, [tp(0, 2, 0), None]) == [0, 0]
    got = store.batch_get_tensor_with_parallelism(keys, [ReadTarget("full", tp(0, 2, 0)), None])
    assert [arr(g).tolist() for g in got] == [t.tolist() for t in ts]
    assert store.batch_put_tensor_with_parallelism(keys, ts, [None]) == [-600, -600]  # lengths differ
    bufs = [ctypes.create_string_buffer(1024) for _ in keys]
    got = store.batch_get_tensor_with_parallelism_into(keys, [ctypes.addressof(b) for b in bufs], [1024, 1024],
                                                       [ReadTarget("full", tp(0, 2, 0)), None])
    assert [arr(g).tolist() for g in got] == [t.tolist() for t in ts]
    k3 = [uid(), uid()]
    sizes = [META + t.nbytes for t in ts]
    assert store.batch_upsert_tensor_with_parallelism_from(k3, [ctypes.addressof(b) for b in bufs], sizes,
                                                            [None, tp(1, 3, 1)]) == [0, 0]
    assert arr(store.get_tensor(k3[0])).tolist() == ts[0].tolist()
    assert arr(store.get_tensor_with_parallelism(k3[1], ReadTarget("shard", tp(1, 3, 1)))).tolist() == \
        ts[1][:, 1:2].tolist()
    assert store.put_tensor_with_parallelism_from(uid(), ctypes.addressof(bufs[0]), 100) == -600  # not a tensor


def test_tensor_ext_tp_from(store):
    np = numpy_or_skip()
    m = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    src, key = uid(), uid()
    assert store.put_tensor(src, m) == 0
    buf = ctypes.create_string_buffer(META + m.nbytes)
    assert arr(store.get_tensor_into(src, ctypes.addressof(buf), len(buf))).tolist() == m.tolist()
    assert store.put_tensor_with_tp_from(key, ctypes.addressof(buf), len(buf), tp_size=2, split_dim=1) == 0
    for r in range(2):
        raw = store.get(f"{key}_tp_{r}")
        assert layout(raw)[2:5] == (1, (4, 6), (4, 3))
        assert raw[META:] == m[:, 3 * r:3 * r + 3].tobytes()
        assert arr(store.get_tensor_with_tp(key, tp_rank=r, tp_size=2)).tolist() == m[:, 3 * r:3 * r + 3].tolist()
    assert arr(store.get_tensor_with_parallelism(key, ReadTarget("full", tp(0, 2, 1)))).tolist() == m.tolist()
    keys = [uid(), uid()]
    assert store.batch_put_tensor_with_tp_from(keys, [ctypes.addressof(buf)] * 2, [len(buf)] * 2, tp_size=4) == [0, 0]
    assert store.get(f"{keys[1]}_tp_3")[META:] == m[3].tobytes()
    # negative controls: an uneven split, a truncated buffer, bytes that are no tensor
    assert store.put_tensor_with_tp_from(uid(), ctypes.addressof(buf), len(buf), tp_size=5) == -600
    assert store.put_tensor_with_tp_from(uid(), ctypes.addressof(buf), len(buf) - 4, tp_size=2) == -600
    junk = ctypes.create_string_buffer(b"\x00" * 400)
    assert store.put_tensor_with_tp_from(uid(), ctypes.addressof(junk), 400, tp_size=2) == -600
    assert store.batch_put_tensor_with_tp_from(keys, [ctypes.addressof(buf)], [len(buf)] * 2) == [-600, -600]


def test_tensor_ext_safetensors(store, tmp_path):
    np = numpy_or_skip()
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    key = uid()
    assert store.put_tensor(key, a) == 0
    path = tmp_path / "a.safetensors"
    assert store.save_tensor_to_safetensor(key, str(path)) == 0
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8:8 + n])
    assert header == {key: {"dtype": "I16", "shape": [3, 4], "data_offsets": [0, a.nbytes]}}
    assert (8 + n) % 8 == 0 and raw[8 + n:] == a.tobytes()
    # back in under another key
    k2 = uid()
    t = store.load_tensor_from_safetensor(k2, str(path))
    assert arr(t).tolist() == a.tolist()
    assert arr(store.get_tensor(k2)).tolist() == a.tolist()
    # a file of two tensors written by hand: by name, else the first (by offset)
    b = np.linspace(0, 1, 5, dtype=np.float32)
    hdr = json.dumps({"__metadata__": {"format": "pt"},
                      "w": {"dtype": "F32", "shape": [5], "data_offsets": [a.nbytes, a.nbytes + b.nbytes]},
                      "v": {"dtype": "I16", "shape": [3, 4], "data_offsets": [0, a.nbytes]}}).encode()
    two = tmp_path / "two.safetensors"
    two.write_bytes(struct.pack("<Q", len(hdr)) + hdr + a.tobytes() + b.tobytes())
    assert arr(store.load_tensor_from_safetensor("w", str(two))).tolist() == b.tolist()
    assert arr(store.load_tensor_from_safetensor(uid(), str(two))).tolist() == a.tolist()
    # default key: the file name
    assert store.load_tensor_from_safetensor(file_name=str(path)) is not None
    assert arr(store.get_tensor(str(path))).tolist() == a.tolist()
    # negative controls: a missing key, a missing file, bad files
    assert store.save_tensor_to_safetensor(uid(), str(tmp_path / "none.safetensors")) == -704
    assert not (tmp_path / "none.safetensors").exists()
    assert store.load_tensor_from_safetensor(uid(), str(tmp_path / "missing")) is None
    for name, data in [("short", b"\x01\x00"),
                       ("overrun", struct.pack("<Q", 1 << 20) + b"{}"),
                       ("notjson", struct.pack("<Q", 4) + b"{{{{"),
                       ("empty", struct.pack("<Q", 2) + b"{}"),
                       ("badsize", struct.pack("<Q", len(hdr)) + hdr + a.tobytes())]:  # w's data is missing
        f = tmp_path / name
        f.write_bytes(data)
        k = "w" if name == "badsize" else uid()
        assert store.load_tensor_from_safetensor(k, str(f)) is None, name


def test_tensor_ext_buffer_pool(store):
    """Leases of registered memory: usable for zero-copy puts and gets,
    reused after release, bounded by max_bytes."""
    assert RegisteredBufferPool is BufferPool and ms.BufferLease is ms.RegisteredBufferLease
    pool = BufferPool(store, max_bytes=256 << 10, min_size_class=64 << 10, block_on_exhaustion=False)
    with pool.acquire(1000) as lease:
        assert lease.size == 1000 and lease.ptr % 4096 == 0
        view = lease.buffer.buffer
        view[:5] = b"hello"
        key = uid()
        assert store.put_from(key, lease.ptr, 5) == 0
        p0 = lease.ptr
    with pool.buffer(3000) as again:
        assert again.ptr == p0  # the released buffer of the same class
        assert store.get_into(key, again.ptr, again.size) == 5
        assert bytes(again.buffer.buffer[:5]) == b"hello"
    # 4 buffers of 64 KiB fill the pool; a fifth cannot be had at once
    leases = [pool.acquire(64 << 10) for _ in range(4)]
    with pytest.raises(MemoryError):
        pool.acquire(1)
    with pytest.raises(TimeoutError):
        pool.acquire(1, block=True, timeout=0.05)
    leases.pop().release()
    leases.append(pool.acquire(1))
    with pytest.raises(ValueError):
        pool.acquire(0)
    for lease in leases:
        lease.release()
    pool.close()
    with pytest.raises(RuntimeError):
        pool.acquire(1)
    # prewarmed buffers are registered up front
    p2 = BufferPool(store, prewarm_size=4096, prewarm_count=2, min_size_class=4096)
    a, b = p2.acquire(10), p2.acquire(10)
    assert a.ptr != b.ptr
    a.release(), b.release()
    p2.close()
    with pytest.raises(TypeError):
        BufferPool(None)
