"""mooncake_go.TransferEngine: the native Pythonic API."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import mooncake_go as mg
from mooncake_go import errors

from conftest import numpy_or_skip, torch_or_none


@pytest.fixture
def pair():
    """Two engines in this process talking over TCP."""
    with mg.TransferEngine(host="127.0.0.1", transport="tcp") as a, \
            mg.TransferEngine(host="127.0.0.1", transport="tcp") as b:
        yield a, b


def addr_of(buf) -> int:
    return mg._buffers.address(buf)[0]


def test_identity(pair):
    a, b = pair
    assert a.name.startswith("127.0.0.1:")
    rpc, data = a.ports
    assert a.name == f"127.0.0.1:{rpc}" and a.rpc_port == rpc and data > 0
    assert a.name != b.name
    assert repr(a) == f"<TransferEngine {a.name}>"
    assert mg.abi_version >> 16 == 1


def test_write_read_numpy(pair):
    np = numpy_or_skip()
    a, b = pair
    src = np.arange(1 << 18, dtype=np.uint32)  # 1 MiB
    dst = np.zeros_like(src)
    a.register_memory(src)
    b.register_memory(dst)
    seg = a.open_segment(b.name)
    assert a.open_segment(b.name) == seg  # cached
    a.write(seg, src, addr_of(dst))
    assert np.array_equal(src, dst)
    back = np.zeros_like(src)
    a.register_memory(back)
    a.read(b.name, back, addr_of(dst))  # by segment name
    assert np.array_equal(back, src)
    a.unregister_memory(back)


def test_buffer_kinds(pair):
    """Raw addresses, bytearray, memoryview, ctypes arrays and torch-like
    objects with data_ptr() are all accepted as local memory."""
    a, b = pair
    dst = bytearray(4096)
    b.register_memory(dst)
    seg = a.open_segment(b.name)
    remote = addr_of(dst)

    src = bytearray(b"A" * 1024)
    a.register_memory(src)
    a.write(seg, src, remote)  # bytearray, whole
    a.write(seg, memoryview(src)[:10], remote + 1024)  # memoryview
    raw = (ctypes.c_char * 64)(*b"B" * 64)
    a.register_memory(raw)
    a.write(seg, ctypes.addressof(raw), remote + 2048, 64)  # raw address
    a.write(seg, raw, remote + 3000)  # ctypes array

    class FakeTensor:  # the part of torch.Tensor the package uses
        def __init__(self, arr):
            self.arr = arr

        def data_ptr(self):
            return ctypes.addressof(self.arr)

        def numel(self):
            return len(self.arr) // 4

        def element_size(self):
            return 4

        def is_contiguous(self):
            return True

    t = FakeTensor(raw)
    a.write(seg, t, remote + 3100)

    class Device:
        type = "mps"

    gpu = FakeTensor(raw)
    gpu.device = Device()
    with pytest.raises(ValueError):
        a.write(seg, gpu, remote)  # memory neither the CPU nor CUDA reaches
    assert bytes(dst[:1024]) == b"A" * 1024
    assert bytes(dst[1024:1034]) == b"A" * 10
    assert bytes(dst[2048:2112]) == b"B" * 64
    assert bytes(dst[3000:3064]) == b"B" * 64 and bytes(dst[3100:3164]) == b"B" * 64

    with pytest.raises(TypeError):
        a.write(seg, 1234, remote)  # a raw address needs a length
    with pytest.raises(ValueError):
        a.read(seg, b"immutable", remote)  # reads need writable memory
    with pytest.raises(ValueError):
        a.write(seg, src, remote, 99999)  # longer than the buffer


def test_torch_tensors(pair):
    torch = torch_or_none()
    if torch is None:
        pytest.skip("torch is not installed (CPU tensors are covered by the data_ptr() look-alike)")
    a, b = pair
    src = torch.arange(4096, dtype=torch.float32)
    dst = torch.zeros(4096, dtype=torch.float32)
    a.register_memory(src)
    b.register_memory(dst)
    a.write(b.name, src, dst.data_ptr())
    assert torch.equal(src, dst)


def test_batches(pair):
    np = numpy_or_skip()
    a, b = pair
    n, block = 16, 4096
    src = np.random.default_rng(1).integers(0, 255, n * block, dtype=np.uint8)
    dst = np.zeros_like(src)
    a.register_memory(src)
    b.register_memory(dst)
    seg = a.open_segment(b.name)
    base_s, base_d = addr_of(src), addr_of(dst)
    reqs = [mg.Request(mg.Op.WRITE, base_s + i * block, seg, base_d + i * block, block) for i in range(n)]
    batch = a.allocate_batch(n)
    a.submit(batch, reqs[:8])
    a.submit(batch, reqs[8:])  # task ids continue
    st = a.wait(batch, timeout=30)
    assert st.state == mg.State.COMPLETED and st.transferred == n * block
    assert a.task_status(batch, 15).state == mg.State.COMPLETED
    assert a.batch_status(batch).state == mg.State.COMPLETED
    a.free_batch(batch)
    assert np.array_equal(src, dst)

    # A reusable RequestArray: filled once, submitted many times.
    arr = mg.RequestArray.of(mg.Op.READ, seg, [base_s + i * block for i in range(n)],
                             [base_d + i * block for i in range(n)], [block] * n)
    dst[:] = 7
    for _ in range(3):
        a.transfer(arr)
    assert (src == 7).all()


def test_errors(pair):
    a, b = pair
    dst = bytearray(4096)
    b.register_memory(dst)
    src = bytearray(4096)
    seg = a.open_segment(b.name)
    with pytest.raises(errors.MooncakeError):  # local memory not registered
        a.write(seg, src, addr_of(dst))
    a.register_memory(src)
    with pytest.raises(errors.AddressOverlapped):
        a.register_memory(src)
    with pytest.raises(errors.EngineError) as ei:  # the peer rejects the range
        a.write(seg, src, 4096, 16)
    assert ei.value.code < 0 and ei.value.domain == errors.DOMAIN_ENGINE and ei.value.message
    with pytest.raises(errors.MooncakeError):
        a.open_segment("127.0.0.1:1")  # nobody there
    with pytest.raises(errors.MooncakeError):
        a.free_batch(123456)
    # The library recovers its own panics; this process keeps running.
    e = mg._lib.Error()
    assert mg._lib.lib.mc_debug_panic(e) == errors.PANIC
    assert isinstance(mg._lib.error_from(e), errors.Panic)


def test_closed_engine():
    e = mg.TransferEngine(host="127.0.0.1")
    name = e.name
    e.close()
    e.close()  # idempotent
    assert e.closed and repr(e) == "<TransferEngine closed>"
    with pytest.raises(errors.InvalidHandle):
        e.open_segment(name)
    with mg.TransferEngine(host="127.0.0.1") as e2:
        pass
    assert e2.closed


def test_dropped_engine_is_destroyed():
    before = mg.live_handles()[0]
    e = mg.TransferEngine(host="127.0.0.1")
    assert mg.live_handles()[0] == before + 1
    del e
    import gc

    gc.collect()
    assert mg.live_handles()[0] == before


def test_notifications(pair):
    a, b = pair
    buf = bytearray(64)
    a.register_memory(buf)
    dst = bytearray(64)
    b.register_memory(dst)
    seg = a.open_segment(b.name)
    a.transfer([mg.Request(mg.Op.WRITE, buf, seg, addr_of(dst))], notify=("agent-a", "batch 1 done"))
    a.send_notify(seg, "agent-a", "hello")
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        got += b.get_notifies()
        time.sleep(0.01)
    # The batch notification leaves when the batch completes, on its own
    # path: the two may arrive in either order.
    assert sorted(got) == [mg.Notify("agent-a", "batch 1 done"), mg.Notify("agent-a", "hello")]
    assert b.get_notifies() == []


def test_shared_buffer(pair):
    a, b = pair
    with a.allocate_buffer(1 << 20) as src, b.allocate_buffer(1 << 20) as dst:
        src.view()[:5] = b"hello"
        a.write(b.name, src.addr, dst.addr, 5)
        assert bytes(dst.view()[:5]) == b"hello"
        assert (dst.addr, 1 << 20) in b.segment_buffers(b.name) or b.segment_buffers(mg.LOCAL_SEGMENT)
        assert any(addr == dst.addr for addr, _ in a.segment_buffers(b.name))


def test_peer_in_another_process(tmp_path):
    """An engine in a child process (its own copy of the library)."""
    np = numpy_or_skip()
    script = textwrap.dedent("""
        import sys, json, numpy as np, mooncake_go as mg
        e = mg.TransferEngine(host="127.0.0.1")
        buf = np.zeros(1 << 20, dtype=np.uint8)
        e.register_memory(buf)
        print(json.dumps({"name": e.name, "addr": buf.ctypes.data}), flush=True)
        sys.stdin.readline()               # the parent wrote
        print(int(buf.sum()), flush=True)
        sys.stdin.readline()
        e.close()
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        import json

        info = json.loads(p.stdout.readline())
        with mg.TransferEngine(host="127.0.0.1") as e:
            src = np.ones(1 << 20, dtype=np.uint8)
            e.register_memory(src)
            e.write(info["name"], src, info["addr"])
            p.stdin.write("go\n")
            p.stdin.flush()
            assert int(p.stdout.readline()) == 1 << 20
        p.stdin.write("bye\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()


def test_gil_released_during_transfer(pair):
    """A thread inside a transfer does not hold the GIL: another thread
    runs Python while the call is in flight.

    The switch interval is raised to 30 s, so the interpreter never takes
    the GIL from a thread by force: the main thread can only run while the
    mover is inside the library if the call released the GIL."""
    np = numpy_or_skip()
    a, b = pair
    size = 64 << 20
    src = np.ones(size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    a.register_memory(src)
    b.register_memory(dst)
    seg = a.open_segment(b.name)
    state = {"in_call": False}

    def mover():
        for _ in range(4):
            state["in_call"] = True
            a.write(seg, src, addr_of(dst))
            state["in_call"] = False

    old = sys.getswitchinterval()
    sys.setswitchinterval(30)
    try:
        t = threading.Thread(target=mover)
        t.start()
        seen = 0
        while t.is_alive():
            if state["in_call"]:
                seen += 1
            time.sleep(0.001)
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert seen >= 5, f"the main thread ran {seen} times while a transfer was in flight"
    assert dst[-1] == 1


def test_threads_share_one_engine(pair):
    """Many threads submit to one engine at once, each its own region."""
    np = numpy_or_skip()
    a, b = pair
    threads, block, rounds = 8, 64 << 10, 20
    src = np.zeros(threads * block, dtype=np.uint8)
    dst = np.zeros_like(src)
    a.register_memory(src)
    b.register_memory(dst)
    seg = a.open_segment(b.name)
    errors_ = []

    def work(i):
        try:
            lo = i * block
            for r in range(rounds):
                src[lo:lo + block] = (i * 31 + r) % 251
                a.write(seg, src[lo:lo + block], addr_of(dst) + lo)
                back = np.empty(block, dtype=np.uint8)
                a.register_memory(back)
                a.read(seg, back, addr_of(dst) + lo)
                a.unregister_memory(back)
                assert (back == (i * 31 + r) % 251).all()
        except Exception as e:  # reported below
            errors_.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors_, errors_
    assert np.array_equal(src, dst)


def test_import_does_not_start_the_runtime():
    """Importing the packages does not load the library (and start a Go
    runtime), so a process may import mooncake.engine and then fork
    workers that use it (vLLM's default start method on CPU is fork)."""
    script = textwrap.dedent("""
        import multiprocessing as mp, sys
        import mooncake.engine, mooncake.store, mooncake_go
        assert not mooncake_go._lib.lib.loaded, "imported packages loaded the library"

        def child(q):
            te = mooncake.engine.TransferEngine()
            q.put(te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""))
            q.put(te.get_rpc_port() > 0)
            te.close()

        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        rc, port_ok = q.get(timeout=60), q.get(timeout=60)
        p.join(60)
        assert rc == 0 and port_ok and p.exitcode == 0, (rc, port_ok, p.exitcode)
        # and the parent can load it afterwards
        te = mooncake.engine.TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        te.close()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
