"""Put sessions of the official mooncake.store against a real store: the
layer-by-layer save of vLLM-Ascend's and SGLang's session paths
(batch_put_session_start, one batch_put_from_multi_buffer_ranges per
layer, batch_put_session_end), read back by another client; the codes the
official 0.3.13.post1 client answers for the refusals (a zero size, a key
that exists, a session already open, no session, a range past the size,
mismatched lists); revoke leaves the key absent; and the mooncake_go
native forms."""

from __future__ import annotations

import ctypes
import uuid

import pytest

from mooncake.store import MooncakeDistributedStore, ReplicateConfig
from mooncake_go import errors

from conftest import LOCAL_BUFFER, SEGMENT

INVALID_PARAMS, NO_AVAILABLE_HANDLE, OBJECT_ALREADY_EXISTS = -600, -200, -705


def open_store(master: str) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", master) == 0
    return s


@pytest.fixture
def store(master):
    s = open_store(master)
    yield s
    assert s.close() == 0


@pytest.fixture
def reader(master):
    s = open_store(master)
    yield s
    assert s.close() == 0


def uid() -> str:
    return uuid.uuid4().hex


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed + (i >> 8)) & 0xFF for i in range(n))


def test_layerwise_put_session(store, reader):
    """Two keys of four layers, saved last layer first, one ranged call per
    layer: key 0 from a registered buffer, key 1 from memory that is not
    registered (staged); nothing is readable before the end, everything
    after, byte for byte, from another client."""
    layers, page = 4, 64 << 10
    keys = [uid(), uid()]
    values = [pattern(layers * page, 20 + i) for i in range(2)]
    reg = ctypes.create_string_buffer(values[0], layers * page)
    loose = ctypes.create_string_buffer(values[1], layers * page)
    bases = [ctypes.addressof(reg), ctypes.addressof(loose)]
    assert store.register_buffer(bases[0], layers * page) == 0
    try:
        assert store.batch_put_session_start(keys, [layers * page] * 2, ReplicateConfig()) == [0, 0]
        assert reader.is_exist(keys[0]) == 0
        for layer in reversed(range(layers)):
            got = store.batch_put_from_multi_buffer_ranges(
                keys, [[b + layer * page] for b in bases], [[page], [page]], [[layer * page], [layer * page]])
            assert got == [page, page]
            assert reader.is_exist(keys[1]) == 0
        assert store.batch_put_session_end(keys) == [0, 0]
        for k, v in zip(keys, values):
            assert reader.get(k) == v
        # A value in several ranges of one call, out of order.
        k = uid()
        assert store.batch_put_session_start([k], [3000]) == [0]
        assert store.batch_put_from_multi_buffer_ranges(
            [k], [[bases[1] + 1000, bases[1]]], [[2000, 1000]], [[1000, 0]]) == [3000]
        assert store.batch_put_session_end([k]) == [0]
        assert reader.get(k) == values[1][:3000]
    finally:
        assert store.unregister_buffer(bases[0]) == 0


def test_put_session_refusals(store, reader):
    """The official codes: -600 for an empty key, a zero size, a session
    already open, mismatched lists, no session and a range past the size;
    -705 for a key that exists or comes twice; -200 past the pool."""
    buf = ctypes.create_string_buffer(pattern(64, 1), 64)
    p = ctypes.addressof(buf)
    exists, ok, zero, dup = uid(), uid(), uid(), uid()
    assert store.put(exists, b"x") == 0
    assert store.batch_put_session_start([ok, zero, exists, "", dup, dup], [32, 0, 32, 32, 8, 8]) == [
        0, INVALID_PARAMS, OBJECT_ALREADY_EXISTS, INVALID_PARAMS, 0, OBJECT_ALREADY_EXISTS]
    assert store.batch_put_session_start([ok], [32]) == [INVALID_PARAMS]  # already open
    assert store.batch_put_session_start([uid(), uid()], [32]) == [INVALID_PARAMS] * 2
    assert store.batch_put_session_start([uid()], [-1]) == [INVALID_PARAMS]
    assert store.batch_put_session_start([uid()], [1 << 40]) == [NO_AVAILABLE_HANDLE]

    ranges = store.batch_put_from_multi_buffer_ranges
    assert ranges([uid()], [[p]], [[16]], [[0]]) == [INVALID_PARAMS]  # no session
    assert ranges([ok], [[p]], [[16]], [[20]]) == [INVALID_PARAMS]  # past the 32 bytes
    assert ranges([ok], [[p, p]], [[16]], [[0]]) == [INVALID_PARAMS]  # one key's lists differ
    assert ranges([ok, dup], [[p]], [[16]], [[0]]) == [INVALID_PARAMS] * 2  # the outer lists differ
    assert ranges([ok, exists], [[p], [p]], [[16], [16]], [[16], [0]]) == [16, INVALID_PARAMS]
    assert ranges([ok], [[p]], [[0]], [[0]]) == [0]

    # End without writing the rest: readable, the written bytes in place.
    assert store.batch_put_session_end([ok, uid()]) == [0, INVALID_PARAMS]
    assert reader.get(ok)[16:] == pattern(16, 1)
    assert store.batch_put_session_end([ok]) == [INVALID_PARAMS]  # ended
    assert store.batch_put_session_revoke([ok]) == [INVALID_PARAMS]
    assert store.batch_put_session_end([]) == []
    assert store.batch_put_session_revoke([dup]) == [0]


def test_put_session_revoke(store, reader):
    """A revoked key never becomes readable, its session is gone (ranges
    and end refused), and the key can be put again."""
    buf = ctypes.create_string_buffer(pattern(4096, 5), 4096)
    p = ctypes.addressof(buf)
    k = uid()
    assert store.batch_put_session_start([k], [4096]) == [0]
    assert store.batch_put_from_multi_buffer_ranges([k], [[p]], [[4096]], [[0]]) == [4096]
    assert store.batch_put_session_revoke([k, uid()]) == [0, INVALID_PARAMS]
    assert reader.is_exist(k) == 0
    assert reader.get(k) == b""
    assert store.batch_put_from_multi_buffer_ranges([k], [[p]], [[1]], [[0]]) == [INVALID_PARAMS]
    assert store.batch_put_session_end([k]) == [INVALID_PARAMS]
    assert store.batch_put_session_start([k], [4096]) == [0]
    assert store.batch_put_from_multi_buffer_ranges([k], [[p]], [[4096]], [[0]]) == [4096]
    assert store.batch_put_session_end([k]) == [0]
    assert reader.get(k) == pattern(4096, 5)


def test_put_session_open_at_close(master, reader):
    """Closing a store revokes the sessions it left open: another client
    puts the key at once."""
    w = open_store(master)
    k = uid()
    assert w.batch_put_session_start([k], [1000]) == [0]
    assert w.close() == 0
    assert reader.put(k, b"after") == 0
    assert reader.get(k) == b"after"


def test_native_put_session(master):
    """mooncake_go.Store: put_session_start, batch_put_ranges of (offset,
    buffer) pairs, put_session_end / put_session_revoke with None or the
    error per key."""
    import mooncake_go

    with mooncake_go.Store(master=master, local_hostname="127.0.0.1", protocol="tcp",
                           segment_size=16 << 20, local_buffer_size=16 << 20) as s:
        a, b = uid(), uid()
        assert s.put_session_start([a, b], [10, 10]) == [None, None]
        r = s.put_session_start([a], [10])
        assert isinstance(r[0], errors.MooncakeError) and r[0].code == INVALID_PARAMS
        assert s.batch_put_ranges([a, b], [[(5, b"world"), (0, b"hello")], [(0, b"0123456789")]]) == [10, 10]
        r = s.batch_put_ranges([a], [[(6, b"world")]])
        assert r[0].code == INVALID_PARAMS
        assert s.put_session_end([a]) == [None]
        assert s.put_session_revoke([b]) == [None]
        assert s.get(a) == b"helloworld"
        assert not s.exists(b)
