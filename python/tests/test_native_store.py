"""mooncake_go.Store: the native Pythonic API against a real cluster."""

from __future__ import annotations

import ctypes
import os
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
    with pytest.raises(errors.ObjectAlreadyExists):
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


def test_put_of_an_existing_key_says_so(store, master):
    """A second put of a key raises ObjectAlreadyExists (batches give it
    per key) and leaves the first value; upsert replaces it. A store opened
    with exist_ok=True keeps Mooncake's silent success, and the compat
    module still answers Mooncake's code for it, 0."""
    np = numpy_or_skip()
    k, fresh = key(), key()
    store.put(k, b"first")
    with pytest.raises(errors.ObjectAlreadyExists) as ei:
        store.put(k, b"second")
    assert ei.value.code == -705 and ei.value.domain == errors.DOMAIN_STORE
    assert "already exists" in str(ei.value).lower() or k in str(ei.value)
    res = store.batch_put([k, fresh], [b"x", b"y"])
    assert isinstance(res[0], errors.ObjectAlreadyExists) and res[1] is None
    buf = np.full(64, 7, dtype=np.uint8)
    store.register_buffer(buf)
    try:
        with pytest.raises(errors.ObjectAlreadyExists):
            store.put_from(k, buf)
        res = store.batch_put_from_parts([k], [[buf[:10], buf[10:20]]])
        assert isinstance(res[0], errors.ObjectAlreadyExists)
    finally:
        store.unregister_buffer(buf)
    assert store.get(k) == b"first"
    assert store.get(fresh) == b"y"
    store.upsert(k, b"third")
    assert store.get(k) == b"third"

    with mg.Store(master, segment_size=-1, local_buffer_size=LOCAL_BUFFER, local_hostname="127.0.0.1",
                  exist_ok=True) as quiet:
        quiet.put(k, b"fourth")
        assert quiet.batch_put([k], [b"fifth"]) == [None]
    assert store.get(k) == b"third"

    from mooncake.store import MooncakeDistributedStore
    compat = MooncakeDistributedStore()
    assert compat.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL_BUFFER, "tcp", "", master) == 0
    try:
        assert compat.put(k, b"sixth") == 0
        assert compat.put_batch([k, key()], [b"a", b"b"]) == 0
    finally:
        assert compat.close() == 0
    assert store.get(k) == b"third"


def test_remove_by_regex(store):
    prefix = key("rx")
    for i in range(4):
        store.put(f"{prefix}/{i}", b"v")
    store.put(f"keep-{prefix}/0", b"v")
    assert store.remove_by_regex(f"^{prefix}/[0-2]$") == 3
    assert [store.exists(f"{prefix}/{i}") for i in range(4)] == [False, False, False, True]
    assert store.exists(f"keep-{prefix}/0")
    with pytest.raises(errors.InvalidParams):
        store.remove_by_regex("(")
    res = store.batch_remove([f"{prefix}/3", f"{prefix}/0"], force=True)
    assert res[0] is None and isinstance(res[1], errors.ObjectNotFound)


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


def test_parts_zero_copy(store):
    """batch_put_from_parts / batch_get_into_parts: a value made of several
    registered buffers (odd sizes), read back whole and into another
    layout, straight into the parts; unregistered parts and too-small
    layouts are refused per key."""
    np = numpy_or_skip()
    src = np.random.default_rng(5).integers(0, 255, 1 << 20, dtype=np.uint8)
    dst = np.full(1 << 20, 0xEE, dtype=np.uint8)
    store.register_buffer(src)
    store.register_buffer(dst)
    ka, kb = key("parts"), key("parts")
    a_parts = [src[1:2], src[10:4107], src[5000:65000]]  # 1 + 4097 + 60000
    b_parts = [src[70000:70007], src[80000:80000], src[90000:123333]]  # with an empty part
    assert store.batch_put_from_parts([ka, kb], [a_parts, b_parts]) == [None, None]
    want_a = b"".join(p.tobytes() for p in a_parts)
    want_b = b"".join(p.tobytes() for p in b_parts)
    assert store.get(ka) == want_a
    assert store.get(kb) == want_b
    # Another layout; b's parts hold more than its value: a prefix is filled.
    into_a = [dst[3:30003], dst[30003:30003 + len(want_a) - 30000]]
    into_b = [dst[200000:210000], dst[220000:260000]]
    got = store.batch_get_into_parts([ka, kb], [into_a, into_b])
    assert got == [len(want_a), len(want_b)]
    assert b"".join(p.tobytes() for p in into_a) == want_a
    assert dst[200000:210000].tobytes() + dst[220000:220000 + len(want_b) - 10000].tobytes() == want_b
    assert (dst[220000 + len(want_b) - 10000:260000] == 0xEE).all()  # past the value
    assert (dst[0:3] == 0xEE).all() and (dst[210000:220000] == 0xEE).all()
    # Sizes given apart from the buffers (raw addresses).
    n = store.batch_get_into_parts([ka], [[int(dst.ctypes.data) + 500000, int(dst.ctypes.data) + 600000]],
                                   [[50000, 50000]])
    assert n == [len(want_a)]
    assert dst[500000:550000].tobytes() + dst[600000:600000 + len(want_a) - 50000].tobytes() == want_a
    # Too small: refused, nothing read.
    dst[700000:800000] = 0xEE
    res = store.batch_get_into_parts([ka], [[dst[700000:710000], dst[720000:730000]]])
    assert isinstance(res[0], errors.InvalidParams)
    assert (dst[700000:800000] == 0xEE).all()
    # A part outside registered memory fails its key only (nothing is
    # copied into a registered buffer on the way).
    loose = np.ones(100, dtype=np.uint8)
    kc, kd = key("parts"), key("parts")
    res = store.batch_put_from_parts([kc, kd], [[src[:10]], [src[:10], loose]])
    assert res[0] is None and isinstance(res[1], errors.InvalidParams)
    assert not store.exists(kd)
    res = store.batch_get_into_parts([kc], [[loose]])
    assert isinstance(res[0], errors.InvalidParams)
    with pytest.raises(ValueError):
        store.batch_put_from_parts([kc], [[src[:10]]], [[10], [10]])


def test_close_while_threads_read(master):
    """Closing a store while other threads read through it: their calls
    return or raise (InvalidHandle once closed), the process survives
    (close waits for the calls in progress before freeing the staging
    memory they copy through)."""
    import time

    for _ in range(3):
        st = mg.Store(master, segment_size=16 << 20, local_buffer_size=8 << 20, local_hostname="127.0.0.1")
        keys = [key("race") for _ in range(4)]
        for k in keys:
            st.put(k, bytes(256 << 10))
        stop = threading.Event()
        unexpected = []

        def reader(k):
            out = bytearray(256 << 10)
            while not stop.is_set():
                try:
                    st.get_into(k, out)
                except errors.InvalidHandle:
                    pass
                except errors.MooncakeError as e:  # e.g. the master connection closing
                    if e.code == errors.PANIC:
                        unexpected.append(e)

        ts = [threading.Thread(target=reader, args=(k,)) for k in keys]
        for t in ts:
            t.start()
        time.sleep(0.05)
        st.close()
        time.sleep(0.01)
        stop.set()
        for t in ts:
            t.join()
        assert not unexpected, unexpected
        with pytest.raises(errors.InvalidHandle):
            st.get_size(keys[0])


def test_get_reads_in_one_call(store, monkeypatch):
    """get of a value no larger than the last one read is one call into the
    library (it used to ask for the size first: two calls, and a copy out
    of a zeroed buffer); a larger value costs a second call, a smaller one
    none, and every size comes back whole."""
    from mooncake_go import _lib

    calls = []
    real = _lib.lib.mc_store_get

    def counting(*args):
        calls.append(args[3])  # the buffer's length
        return real(*args)

    monkeypatch.setattr(_lib.lib, "mc_store_get", counting)
    big, bigger, small = key(), key(), key()
    values = {big: bytes(range(256)) * 4096, bigger: b"\x07" * (3 << 20), small: b"tiny"}
    for k, v in values.items():
        store.put(k, v)
    cases = [  # (key, calls expected)
        (big, 2),     # the first get of 1 MiB: guessed small, told the size
        (big, 1),     # the same size again: one call
        (bigger, 2),  # larger than the last: the size, then the value
        (small, 1),   # smaller: read into the larger guess, then cut
        (small, 1),
        (big, 2),
    ]
    for k, want in cases:
        calls.clear()
        assert store.get(k) == values[k]
        assert len(calls) == want, (k, calls)


def test_upsert_from_any_memory(store):
    """upsert_from / batch_upsert_from read any memory (registered or not)
    and replace existing values; None or the error per key."""
    np = numpy_or_skip()
    loose = np.frombuffer(b"first value", dtype=np.uint8).copy()
    k = key()
    store.upsert_from(k, loose)
    assert store.get(k) == b"first value"
    store.upsert_from(k, int(loose.ctypes.data), 5)  # a raw address and a length
    assert store.get(k) == b"first"
    a, b = key(), key()
    store.put(a, b"old")
    src = np.frombuffer(b"AAAABBBBBB", dtype=np.uint8).copy()
    assert store.batch_upsert_from([a, b, ""], [src[:4], src[4:], src[:1]]) == [None, None, AnyError()]
    assert [store.get(a), store.get(b)] == [b"AAAA", b"BBBBBB"]
    assert store.batch_upsert_from([a], [int(src.ctypes.data)], [2]) == [None]
    assert store.get(a) == b"AA"
    with pytest.raises(ValueError):
        store.batch_upsert_from([a, b], [src])


class AnyError:
    """Equal to any MooncakeError: a result list's failure slot."""

    def __eq__(self, other):
        return isinstance(other, errors.MooncakeError)


def test_batch_exists_errors_in_place(store):
    """batch_exists raises a refused key's error, or with
    raise_on_error=False returns it in the key's place."""
    k = key()
    store.put(k, b"v")
    with pytest.raises(errors.InvalidParams):
        store.batch_exists([k, ""])
    got = store.batch_exists([k, "", key()], raise_on_error=False)
    assert got[0] is True and got[2] is False
    assert isinstance(got[1], errors.InvalidParams)


def test_parts_lists_that_differ_fail_their_key(store):
    """A key whose parts and sizes differ in length gets InvalidParams and
    is not sent; the other keys of the batch go through."""
    np = numpy_or_skip()
    src = np.arange(4096, dtype=np.uint8)
    store.register_buffer(src)
    try:
        p = int(src.ctypes.data)
        a, b = key("parts"), key("parts")
        res = store.batch_put_from_parts([a, b], [[p, p + 100], [p]], [[10, 20], [10, 10]])
        assert res[0] is None and isinstance(res[1], errors.InvalidParams)
        assert store.get(a) == src[:10].tobytes() + src[100:120].tobytes()
        assert not store.exists(b)
        out = np.zeros(64, dtype=np.uint8)
        store.register_buffer(out)
        try:
            q = int(out.ctypes.data)
            res = store.batch_get_into_parts([a, a], [[q], [q, q + 32]], [[30], [30]])
            assert res[0] == 30 and isinstance(res[1], errors.InvalidParams)
        finally:
            store.unregister_buffer(out)
        with pytest.raises(ValueError):
            store.batch_put_from_parts([a], [[p]], [[-1]])  # a negative size
    finally:
        store.unregister_buffer(src)


def test_ranges_of_raw_addresses(store):
    """batch_get_ranges takes (offset, buffer, length) as well as (offset,
    buffer): raw addresses with their lengths, as the compat layer has
    them; malformed ranges raise ValueError."""
    np = numpy_or_skip()
    k = key()
    store.put(k, bytes(range(100)))
    out = np.zeros(64, dtype=np.uint8)
    q = int(out.ctypes.data)
    got = store.batch_get_ranges([k], [[(10, q, 5), (50, out[20:23])]])
    assert got == [8]
    assert out[:5].tobytes() == bytes(range(10, 15)) and out[20:23].tobytes() == bytes([50, 51, 52])
    res = store.batch_get_ranges([k], [[(98, q, 5)]])  # past the end
    assert isinstance(res[0], errors.InvalidParams)
    for bad in ([(0,)], [(0, q, 1, 2)], [(-1, q, 1)]):
        with pytest.raises(ValueError):
            store.batch_get_ranges([k], [bad])


def test_supports_and_public_helpers():
    """Store.supports names the library's optional features; address and
    parse_size are public (the compat layer and connectors use them)."""
    assert mg.Store.supports("ranges") and mg.Store.supports("put_sessions")
    with pytest.raises(ValueError, match="unknown feature"):
        mg.Store.supports("teleport")
    b = bytearray(b"abc")
    addr, n = mg.address(b)
    assert n == 3 and ctypes.string_at(addr, n) == b"abc"
    assert mg.parse_size("16GB") == 16 << 30
    assert {"address", "parse_size"} <= set(mg.__all__)


def wait_stopped(pid: int, timeout: float = 10) -> None:
    """Waits until every thread of pid is stopped: kill returns once the
    signal is sent, and on a loaded machine a thread may still answer a
    request or two before it stops (a put then succeeds)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that just ended
                pass
        if states and all(s in ("T", "t") for s in states):
            return
        assert time.monotonic() < deadline, f"process {pid} not stopped: thread states {states}"
        time.sleep(0.01)


def test_op_timeout_bounds_a_call_to_a_silent_master(mooncake_bin):
    """op_timeout_ms bounds a whole store call: against a master that
    stopped answering (SIGSTOP), a call fails with TimedOut once it
    passes, long before the master call's own timeout."""
    import os
    import signal
    import time

    from mccluster import start_cluster

    c = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "16MiB")
    try:
        with mg.Store(c.master, segment_size=-1, local_buffer_size=LOCAL_BUFFER,
                      rpc_timeout_ms=60_000, op_timeout_ms=300) as st:
            st.put("op-timeout", b"x")
            os.kill(c.proc.pid, signal.SIGSTOP)
            try:
                wait_stopped(c.proc.pid)
                t0 = time.monotonic()
                # A put of a new key must ask the master (a get may be
                # served from cached replica lists and the stopped
                # process's memory, which the same-host path still reads).
                with pytest.raises(errors.TimedOut):
                    st.put("op-timeout-new", b"y")
                took = time.monotonic() - t0
            finally:
                os.kill(c.proc.pid, signal.SIGCONT)
            assert took < 10, f"the call took {took:.1f} s"
    finally:
        c.stop()


def test_parts_from_flat_lists(store):
    """_parts_flat_codes (the connectors' form of the parts calls: every
    key's pieces in two flat lists, a count per key or one for all) puts
    and gets the same values as batch_put_from_parts / batch_get_into_parts,
    with raw codes and lengths; lists that do not add up, or a negative
    size, raise ValueError before anything is sent."""
    np = numpy_or_skip()
    src = np.random.default_rng(9).integers(0, 255, 1 << 16, dtype=np.uint8)
    dst = np.zeros(1 << 16, dtype=np.uint8)
    store.register_buffer(src)
    store.register_buffer(dst)
    try:
        s, d = int(src.ctypes.data), int(dst.ctypes.data)
        a, b, c = key("flat"), key("flat"), key("flat")
        # a: 2 pieces, b: 3 pieces, c: 1 piece (counts per key).
        codes, _ = store._parts_flat_codes(False, [a, b, c], [s, s + 1000, s + 2000, s + 3000, s + 4000, s + 5000],
                                           [10, 20, 30, 40, 50, 60], [2, 3, 1])
        assert codes == [0, 0, 0]
        assert store.get(a) == src[0:10].tobytes() + src[1000:1020].tobytes()
        assert store.get(b) == src[2000:2030].tobytes() + src[3000:3040].tobytes() + src[4000:4050].tobytes()
        assert store.get(c) == src[5000:5060].tobytes()
        # Read back with one count for all keys (a and a fresh one missing).
        missing = key("flat")
        codes, got = store._parts_flat_codes(True, [a, missing], [d, d + 100, d + 200, d + 300], [15, 15, 15, 15], 2)
        assert codes[0] == 0 and got[0] == 30
        assert isinstance(errors.from_status(codes[1], errors.DOMAIN_STORE, ""), errors.ObjectNotFound)
        assert dst[0:15].tobytes() + dst[100:115].tobytes() == store.get(a)
        assert not dst[200:215].any(), "a missing key wrote into its pieces"
        # The same values as the list-of-lists call writes.
        assert store.batch_get_into_parts([b], [[dst[1000:1120]]]) == [120]
        assert dst[1000:1120].tobytes() == store.get(b)
        for bad in (([a], [d], [1, 2], 1), ([a, b], [d, d], [1, 1], [1]), ([a], [d, d], [1, 1], 1),
                    ([a], [d], [-1], 1)):
            with pytest.raises(ValueError):
                store._parts_flat_codes(True, *bad)
        assert store._parts_flat_codes(True, [], [], [], 0) == ([], [])
    finally:
        store.unregister_buffer(src)
        store.unregister_buffer(dst)
