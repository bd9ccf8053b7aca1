"""The official mooncake.store calls beyond the bytes API, against a real
store: SGLang's MooncakeDirectLinker (get sessions, ranged multi-buffer gets), vLLM's
replica descriptors, LMCache's bind_to_numa_node, ranged gets and the
tensor helpers (over numpy; torch where installed). SGLang's standalone
mode (setup_dummy, MooncakeHostMemAllocator) is in test_dummy_client.py."""

from __future__ import annotations

import ctypes
import struct
import uuid

import pytest

import mooncake.store as ms
from mooncake.store import MooncakeDistributedStore, ReplicaStatus, ReplicateConfig

from conftest import LOCAL_BUFFER, SEGMENT, numpy_or_skip


@pytest.fixture
def store(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", master) == 0
    yield s
    assert s.close() == 0


def uid() -> str:
    return uuid.uuid4().hex


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed) & 0xFF for i in range(n))


def test_sglang_direct_linker_ranges(store):
    """MooncakeDirectLinker: session start, one ranged multi-buffer get per
    layer, session end."""
    layers, page = 4, 4096
    keys = [uid(), uid()]
    values = [pattern(layers * page, 10 + i) for i in range(2)]
    for k, v in zip(keys, values):
        assert store.put(k, v) == 0
    buf = ctypes.create_string_buffer(2 * layers * page)
    base = ctypes.addressof(buf)
    assert store.register_buffer(base, len(buf)) == 0
    missing = uid()
    assert store.batch_get_session_start(keys + [missing]) == [0, 0, -704]
    for layer in range(layers):
        ptrs = [[base + (i * layers + layer) * page] for i in range(2)]
        got = store.batch_get_into_multi_buffer_ranges(keys, ptrs, [[page], [page]], [[layer * page], [layer * page]])
        assert got == [page, page]
    assert store.batch_get_session_end(keys + [missing]) == 0
    for i in range(2):
        assert buf.raw[i * layers * page:(i + 1) * layers * page] == values[i]
    # several ranges of one key, one past the end, mismatched lists
    got = store.batch_get_into_multi_buffer_ranges(
        [keys[0], keys[1], keys[0]], [[base, base + 100], [base + 200], [base]],
        [[10, 20], [layers * page], [1]], [[5, 1000], [1], [0, 1]])
    assert got == [30, -600, -600]
    assert buf.raw[:10] == values[0][5:15] and buf.raw[100:120] == values[0][1000:1020]
    assert store.unregister_buffer(base) == 0


def test_get_into_ranges(store):
    k1, k2 = uid(), uid()
    v1, v2 = pattern(5000, 1), pattern(3000, 2)
    assert store.put(k1, v1) == 0 and store.put(k2, v2) == 0
    buf = ctypes.create_string_buffer(10000)
    base = ctypes.addressof(buf)
    out = store.get_into_ranges([base], [[k1, k2, uid()]], [[[0, 100], [1000], [2000]]],
                                [[[10, 4990], [2999], [0]]], [[[50, 10], [1], [5]]])
    assert out == [[[50, 10], [1], [-704]]]
    assert buf.raw[:50] == v1[10:60] and buf.raw[100:110] == v1[4990:] and buf.raw[1000:1001] == v2[2999:]


def test_replica_desc(master, store):
    """vLLM's tier logging: batch_get_replica_desc per key."""
    other = MooncakeDistributedStore()
    assert other.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", master) == 0
    try:
        key = uid()
        rc = ReplicateConfig()
        rc.replica_num = 2
        assert store.put(key, b"x" * 1000, rc) == 0
        descs = other.batch_get_replica_desc([key, "absent-" + uid()])
        reps = descs[key]
        assert len(reps) == 2
        for r in reps:
            assert r.is_memory_replica() and not r.is_disk_replica() and not r.is_local_disk_replica()
            assert r.status == ReplicaStatus.COMPLETE
            d = r.get_memory_descriptor().buffer_descriptor
            assert d.size == 1000 and d.buffer_address and d.transport_endpoint
        assert len({r.segment_name for r in reps}) == 2  # distinct segments
        assert list(descs.values())[1] == []
    finally:
        assert other.close() == 0


def test_bind_to_numa_node_and_enums():
    assert ms.bind_to_numa_node(0) is None
    assert ms.bind_to_numa_node(4096) is None  # no such node: a warning
    assert ms.COMPLETE == ReplicaStatus.COMPLETE == 3
    assert ms.PROCESSING == ms.TaskStatus.PROCESSING == 1  # the task status wins, as officially
    assert ms.KVCACHE == 1 and ms.REPLICA_MOVE == 1
    assert ReplicateConfig().session_ids == []


def test_tensor_helpers(store):
    """put_tensor/get_tensor store the official layout: a 304-byte
    TensorMetadata (magic, version, size, dtype, ndim, layout FULL, data
    offset and size, global and local shape[8]) then the bytes."""
    np = numpy_or_skip()
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    key = uid()
    assert store.put_tensor(key, a) == 0
    raw = store.get(key)
    assert struct.unpack_from("<IHHiiIIQQ", raw) == (0x4D4F4F4E, 1, 304, 0, 3, 0, 0, 304, a.nbytes)
    assert struct.unpack_from("<8q8q", raw, 40) == (2, 3, 4) + (-1,) * 5 + (2, 3, 4) + (-1,) * 5
    assert raw[304:] == a.tobytes()
    b = store.get_tensor(key)
    assert tuple(b.shape) == (2, 3, 4) and np.asarray(b).tobytes() == a.tobytes()
    assert store.get_tensor(uid()) is None
    assert store.put(uid(), b"short") == 0
    # batches, upsert, pub with a config
    keys = [uid(), uid()]
    ts = [np.ones((5,), dtype=np.int64), np.zeros((2, 2), dtype=np.uint8)]
    assert store.batch_put_tensor(keys, ts) == [0, 0]
    got = store.batch_get_tensor(keys)
    assert [np.asarray(g).tobytes() for g in got] == [t.tobytes() for t in ts]
    assert store.upsert_tensor(keys[0], np.full((3,), 7, dtype=np.int16)) == 0
    assert np.asarray(store.get_tensor(keys[0])).tolist() == [7, 7, 7]
    assert store.pub_tensor(uid(), a, ReplicateConfig()) == 0
    assert store.put_tensor(uid(), np.zeros((1,) * 9, dtype=np.float32)) == -600  # 9 dims
    # into a buffer, and back out of it
    buf = ctypes.create_string_buffer(4096)
    t = store.get_tensor_into(key, ctypes.addressof(buf), len(buf))
    assert np.asarray(t).tobytes() == a.tobytes()
    assert store.register_buffer(ctypes.addressof(buf), len(buf)) == 0
    k2 = uid()
    assert store.put_tensor_from(k2, ctypes.addressof(buf), 304 + a.nbytes) == 0
    assert np.asarray(store.get_tensor(k2)).tobytes() == a.tobytes()
    assert store.unregister_buffer(ctypes.addressof(buf)) == 0
    # tensor parallelism: equal shards under key_tp_<rank> (see test_tensor_with_tp_shards)
    base = uid()
    m = np.arange(12 * 3, dtype=np.float32).reshape(12, 3)
    assert store.put_tensor_with_tp(base, m, tp_size=4, split_dim=0) == 0
    shards = [np.asarray(store.get_tensor_with_tp(base, tp_rank=r, tp_size=4)) for r in range(4)]
    assert [s.shape for s in shards] == [(3, 3)] * 4
    assert np.concatenate(shards).tobytes() == m.tobytes()
    assert np.asarray(store.get_tensor_with_tp(key)).tobytes() == a.tobytes()  # tp_size 1: the key itself


def shard_layout(raw: bytes) -> tuple:
    """(layout kind, global shape, local shape, axes) of a stored tensor,
    read as the official TensorMetadata."""
    _, _, _, _, ndim, kind, _, off, nbytes = struct.unpack_from("<IHHiiIIQQ", raw)
    assert (off, nbytes) == (304, len(raw) - 304)
    dims = struct.unpack_from("<8q8qII", raw, 40)
    axes = [struct.unpack_from("<6iq", raw, 176 + 32 * i) for i in range(dims[16])]
    return kind, dims[:ndim], dims[8:8 + ndim], axes


def test_tensor_with_tp_shards(store):
    """put_tensor_with_tp and its batch and pub forms store each rank's
    shard as the official 0.3.13 store does: SHARD metadata with the
    global and the local shape and one TP axis (rank of size, split dim,
    local extent); uneven splits and split dims out of range are refused
    (-600) with nothing written; tp_size 1 stores the tensor whole (FULL)
    under the key itself, not under key_tp_0."""
    np = numpy_or_skip()
    m = np.arange(4 * 6, dtype=np.int32).reshape(4, 6)
    for split_dim, local in ((0, (2, 6)), (1, (4, 3))):
        base = uid()
        assert store.put_tensor_with_tp(base, m, tp_size=2, split_dim=split_dim) == 0
        for r in range(2):
            raw = store.get(f"{base}_tp_{r}")
            assert shard_layout(raw) == (1, (4, 6), local, [(1, 0, r, 2, split_dim, 0, local[split_dim])])
            want = m[2 * r:2 * r + 2] if split_dim == 0 else m[:, 3 * r:3 * r + 3]
            assert raw[304:] == want.tobytes()
            assert np.asarray(store.get_tensor_with_tp(base, tp_rank=r, tp_size=2)).tolist() == want.tolist()
        assert store.is_exist(base) == 0
    # the batch and pub forms: the same layout
    keys = [uid(), uid()]
    assert store.batch_put_tensor_with_tp(keys, [m, m + 1], tp_size=3, split_dim=1) == [0, 0]
    assert shard_layout(store.get(f"{keys[1]}_tp_2"))[:3] == (1, (4, 6), (4, 2))
    assert [np.asarray(t).tolist() for t in store.batch_get_tensor_with_tp(keys, tp_rank=2, tp_size=3)] == \
        [m[:, 4:].tolist(), (m + 1)[:, 4:].tolist()]
    key = uid()
    assert store.pub_tensor_with_tp(key, m, ReplicateConfig(), tp_size=4, split_dim=0) == 0
    assert shard_layout(store.get(f"{key}_tp_3"))[:3] == (1, (4, 6), (1, 6))
    # refused: an uneven split, a split dim out of range (negative too);
    # in a batch, only the tensor that does not split
    for tp_size, split_dim in ((3, 0), (4, 1), (2, 2), (2, -1)):
        key = uid()
        assert store.put_tensor_with_tp(key, m, tp_size=tp_size, split_dim=split_dim) == -600
        assert store.is_exist(f"{key}_tp_0") == 0
    keys = [uid(), uid()]
    assert store.batch_put_tensor_with_tp(keys, [m, m[:3]], tp_size=2) == [0, -600]
    assert store.is_exist(f"{keys[0]}_tp_1") == 1 and store.is_exist(f"{keys[1]}_tp_0") == 0
    assert store.batch_put_tensor_with_tp(keys, [m], tp_size=2) == [-600, -600]
    # tp_size 1: whole, under the key
    key = uid()
    assert store.put_tensor_with_tp(key, m, tp_size=1, split_dim=1) == 0
    assert shard_layout(store.get(key)) == (0, (4, 6), (4, 6), [])
    assert store.is_exist(f"{key}_tp_0") == 0
    assert np.asarray(store.get_tensor_with_tp(key, tp_rank=0, tp_size=1)).tolist() == m.tolist()


def test_tensor_put_copies_nothing_in_python(store):
    """A tensor put writes the metadata and the tensor's own memory (a put
    session's ranged write): no copy of the tensor is made in Python, so
    the Python heap does not grow by its size."""
    np = numpy_or_skip()
    import tracemalloc
    big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB, allocated before tracing
    half = big.size // 2
    cases = [  # the put, and the key it wrote with the elements there
        (lambda k: store.put_tensor(k, big), lambda k: (k, big)),
        (lambda k: store.put_tensor_with_tp(k, big, tp_size=2), lambda k: (f"{k}_tp_1", big[half:])),
        (lambda k: store.put_tensor_with_parallelism(k, big, None), lambda k: (k, big)),
    ]
    for put, stored in cases:
        key = uid()
        tracemalloc.start()
        try:
            assert put(key) == 0
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < big.nbytes // 8, f"{peak} bytes allocated in Python to put {big.nbytes}"
        k, want = stored(key)
        assert np.asarray(store.get_tensor(k)).tobytes() == want.tobytes()
