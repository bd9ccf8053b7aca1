"""mooncake_go.Store: the native Pythonic API against a real cluster."""

from __future__ import annotations

import threading
import uuid

import pytest

import mooncake_go as mg
from mooncake_go import errors

from conftest import LOCAL_BUFFER, SEGMENT, numpy_or_skip


@pytest.fixture
def store(master):
    with mg.Store(master, segment_size=SEGMENT, local_buffer_size=LOCAL_BUFFER, local_hostname="127.0.0.1") as s:
        yield s


def key(prefix="k") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def test_put_get_remove(store):
    k = key()
    store.put(k, b"hello world")
    assert store.exists(k)
    assert store.get(k) == b"hello world"
    assert store.get_size(k) == 11
    store.put(k, b"other")  # write-once: the first value stays
    assert store.get(k) == b"hello world"
    store.upsert(k, b"replaced")
    assert store.get(k) == b"replaced"
    store.remove(k, force=True)
    assert not store.exists(k)
    with pytest.raises(errors.ObjectNotFound) as ei:
        store.get(k)
    assert ei.value.code == -704 and ei.value.domain == errors.DOMAIN_STORE
    assert isinstance(ei.value, LookupError)


def test_large_value_and_kinds(store):
    np = numpy_or_skip()
    k = key()
    big = np.random.default_rng(2).integers(0, 255, 3 << 20, dtype=np.uint8)
    store.put(k, big)  # numpy, through the staging buffer
    assert store.get(k) == big.tobytes()
    k2 = key()
    store.put(k2, memoryview(bytearray(b"mv")))
    assert store.get(k2) == b"mv"


def test_zero_copy(store):
    np = numpy_or_skip()
    buf = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    out = np.zeros_like(buf)
    store.register_buffer(buf)
    store.register_buffer(out)
    try:
        k = key()
        store.put_from(k, buf)
        assert store.get_into(k, out) == buf.nbytes
        assert np.array_equal(buf, out)
        with pytest.raises(errors.MooncakeError):
            store.get_into(k, np.zeros(10, dtype=np.uint8))  # too small
        with pytest.raises(errors.InvalidParams):
            store.put_from(key(), np.zeros(10, dtype=np.uint8))  # not registered
    finally:
        store.unregister_buffer(buf)
        store.unregister_buffer(out)


def test_batches(store):
    np = numpy_or_skip()
    n, size = 8, 64 << 10
    src = np.random.default_rng(3).integers(0, 255, n * size, dtype=np.uint8)
    dst = np.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    try:
        keys = [key("b") for _ in range(n)]
        views = [src[i * size:(i + 1) * size] for i in range(n)]
        assert store.batch_put_from(keys, views) == [None] * n
        assert store.batch_exists(keys + [key()]) == [True] * n + [False]
        outs = [dst[i * size:(i + 1) * size] for i in range(n)]
        assert store.batch_get_into(keys, outs) == [size] * n
        assert np.array_equal(src, dst)
        res = store.batch_get_into([key()], [outs[0]])
        assert isinstance(res[0], errors.ObjectNotFound)
        k2 = [key("p") for _ in range(3)]
        assert store.batch_put(k2, [b"a", b"bb", b"ccc"]) == [None] * 3
        assert [store.get(k) for k in k2] == [b"a", b"bb", b"ccc"]
        assert store.batch_upsert(k2, [b"x", b"y", b"z"]) == [None] * 3
        assert [store.get(k) for k in k2] == [b"x", b"y", b"z"]
    finally:
        store.unregister_buffer(src)
        store.unregister_buffer(dst)


def test_replicate_and_name(store):
    k = key()
    store.put(k, b"v", mg.Replicate(replicas=1, soft_pin=True, preferred_segments=[store.name]))
    assert store.get(k) == b"v"
    assert store.name.startswith("127.0.0.1:")


def test_closed_store(master):
    s = mg.Store(master, segment_size=-1, local_buffer_size=LOCAL_BUFFER)
    s.close()
    s.close()
    with pytest.raises(errors.InvalidHandle):
        s.put("k", b"v")


def test_bad_master():
    with pytest.raises(errors.MooncakeError):
        mg.Store("127.0.0.1:1", segment_size=-1, local_buffer_size=1 << 20, rpc_timeout_ms=500)


def test_threads_share_one_store(store):
    """Concurrent puts and gets through one store from many threads."""
    failures = []

    def work(i):
        try:
            for r in range(10):
                k = f"thread-{i}-{r}-{uuid.uuid4().hex}"
                v = bytes([i, r]) * 4096
                store.put(k, v)
                assert store.get(k) == v
                assert store.exists(k)
        except Exception as e:  # reported below
            failures.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not failures, failures
