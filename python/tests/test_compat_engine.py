"""mooncake.engine.TransferEngine, driven the way its users drive it."""

from __future__ import annotations

import threading
import time

import pytest

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

from conftest import numpy_or_skip

HOST = "127.0.0.1"


def started():
    te = TransferEngine()
    assert te.initialize(HOST, "P2PHANDSHAKE", "tcp", "") == 0
    return te


@pytest.fixture
def engines():
    made = []

    def make():
        te = started()
        made.append(te)
        return te

    yield make
    for te in made:
        te.close()


def test_vllm_mooncake_connector(engines):
    """vLLM's MooncakeConnector: the prefiller registers its KV caches and
    writes contiguous block runs into the decoder's caches with
    batch_transfer_sync_write(session, src_ptrs, dst_ptrs, lengths)."""
    np = numpy_or_skip()
    num_layers, num_blocks, block_size, heads, head_dim = 2, 32, 16, 2, 8
    shape = (2, num_blocks, block_size, heads, head_dim)  # K and V per layer

    def kv_caches(fill):
        rng = np.random.default_rng(fill)
        return {f"layer.{i}": rng.standard_normal(shape).astype(np.float16) if fill else np.zeros(shape, np.float16)
                for i in range(num_layers)}

    prefill, decode = engines(), engines()
    p_caches, d_caches = kv_caches(7), kv_caches(0)
    for te, caches in ((prefill, p_caches), (decode, d_caches)):
        ptrs, lens = [], []
        for t in caches.values():  # every unique KV tensor base
            ptrs.append(t.ctypes.data)
            lens.append(t.nbytes)
        assert te.batch_register_memory(ptrs, lens) == 0
    d_session = f"{HOST}:{decode.get_rpc_port()}"

    # Blocks 3,4,5 of the request land in decoder blocks 10,11,12 (one
    # merged run), block 9 in decoder block 20.
    block_len = p_caches["layer.0"][0].nbytes // num_blocks
    src, dst, lengths = [], [], []
    for t_p, t_d in zip(p_caches.values(), d_caches.values()):
        for kv in range(2):
            p_base = t_p[kv].ctypes.data
            d_base = t_d[kv].ctypes.data
            for p_block, d_block, run in ((3, 10, 3), (9, 20, 1)):
                src.append(p_base + p_block * block_len)
                dst.append(d_base + d_block * block_len)
                lengths.append(run * block_len)
    assert prefill.batch_transfer_sync_write(d_session, src, dst, lengths) == 0
    for t_p, t_d in zip(p_caches.values(), d_caches.values()):
        assert np.array_equal(t_p[:, 3:6], t_d[:, 10:13])
        assert np.array_equal(t_p[:, 9], t_d[:, 20])
        assert not t_d[:, 0:10].any()


def test_sglang_transfer_engine(engines):
    """SGLang's MooncakeTransferEngine: register/unregister single regions,
    transfer_sync_write and batch_transfer_sync_write by session id."""
    np = numpy_or_skip()
    p, d = engines(), engines()
    kv = np.arange(4096, dtype=np.int64)
    aux = np.arange(64, dtype=np.int64)
    out_kv, out_aux = np.zeros_like(kv), np.zeros_like(aux)
    assert p.register_memory(kv.ctypes.data, kv.nbytes) == 0
    assert p.batch_register_memory([aux.ctypes.data], [aux.nbytes]) == 0
    assert d.register_memory(out_kv.ctypes.data, out_kv.nbytes) == 0
    assert d.register_memory(out_aux.ctypes.data, out_aux.nbytes) == 0
    session = f"{HOST}:{d.get_rpc_port()}"
    assert p.transfer_sync_write(session, aux.ctypes.data, out_aux.ctypes.data, aux.nbytes) == 0
    half = kv.nbytes // 2
    assert p.batch_transfer_sync_write(session, [kv.ctypes.data, kv.ctypes.data + half],
                                       [out_kv.ctypes.data, out_kv.ctypes.data + half], [half, half]) == 0
    assert np.array_equal(kv, out_kv) and np.array_equal(aux, out_aux)
    assert p.unregister_memory(kv.ctypes.data) == 0
    assert p.batch_unregister_memory([aux.ctypes.data]) == 0
    assert p.send_probe(session) == 0


def test_return_codes(engines):
    """Failures are negative integers, never exceptions."""
    np = numpy_or_skip()
    a, b = engines(), engines()
    buf = np.zeros(4096, np.uint8)
    peer = np.zeros(4096, np.uint8)
    assert b.register_memory(peer.ctypes.data, peer.nbytes) == 0
    session = f"{HOST}:{b.get_rpc_port()}"
    # local memory not registered
    assert a.transfer_sync_write(session, buf.ctypes.data, peer.ctypes.data, 16) < 0
    assert a.register_memory(buf.ctypes.data, buf.nbytes) == 0
    assert a.register_memory(buf.ctypes.data, buf.nbytes) == -7  # overlapped
    # remote address outside the peer's registered memory
    assert a.transfer_sync_write(session, buf.ctypes.data, 4096, 16) < 0
    # nobody at that session
    assert a.transfer_sync_write(f"{HOST}:1", buf.ctypes.data, peer.ctypes.data, 16) < 0
    assert a.send_probe(f"{HOST}:1") < 0
    # mismatched lists
    assert a.batch_transfer_sync_write(session, [buf.ctypes.data], [], [16]) < 0
    assert a.batch_register_memory([1], []) < 0
    # after all that the engine still works
    assert a.transfer_sync_write(session, buf.ctypes.data, peer.ctypes.data, 16) == 0
    te = TransferEngine()  # not initialized
    assert te.get_rpc_port() < 0 and te.register_memory(buf.ctypes.data, 16) < 0
    assert te.transfer_sync_write(session, buf.ctypes.data, peer.ctypes.data, 16) < 0


def test_read_async_and_status(engines):
    np = numpy_or_skip()
    a, b = engines(), engines()
    local = np.zeros(1 << 16, np.uint8)
    remote = np.random.default_rng(5).integers(0, 255, 1 << 16, dtype=np.uint8)
    assert a.register_memory(local.ctypes.data, local.nbytes) == 0
    assert b.register_memory(remote.ctypes.data, remote.nbytes) == 0
    session = f"{HOST}:{b.get_rpc_port()}"
    assert a.get_first_buffer_address(session) == remote.ctypes.data
    assert a.transfer_sync_read(session, local.ctypes.data, remote.ctypes.data, 100) == 0
    assert np.array_equal(local[:100], remote[:100])
    assert a.batch_transfer_sync_read(session, [local.ctypes.data], [remote.ctypes.data], [local.nbytes]) == 0
    assert np.array_equal(local, remote)
    assert a.transfer_sync(session, local.ctypes.data, remote.ctypes.data, 8, TransferOpcode.Read) == 0
    assert a.batch_transfer_sync(session, [local.ctypes.data], [remote.ctypes.data], [8], TransferOpcode.Write) == 0

    local[:] = 9
    ids = [a.batch_transfer_async_write(session, [local.ctypes.data], [remote.ctypes.data], [1024]),
           a.batch_transfer_async(session, [local.ctypes.data + 1024], [remote.ctypes.data + 1024], [1024],
                                  TransferOpcode.Write)]
    assert all(ids)
    assert a.get_batch_transfer_status(ids) == 0
    assert (remote[:2048] == 9).all()
    rid = a.batch_transfer_async_read(session, [local.ctypes.data + 60000], [remote.ctypes.data + 4096], [16])
    assert a.get_batch_transfer_status([rid]) == 0

    bid = a.transfer_submit_write(session, local.ctypes.data, remote.ctypes.data + 8192, 4096)
    assert bid
    deadline = time.monotonic() + 30
    while (st := a.transfer_check_status(bid)) == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert st == 1
    assert (remote[8192:12288] == 9).all()
    bad = a.batch_transfer_async_write(session, [local.ctypes.data], [4096], [16])  # outside the peer's memory
    assert bad == 0 or a.get_batch_transfer_status([bad]) < 0


def test_notify_and_managed_buffers(engines):
    a, b = engines(), engines()
    src = a.allocate_managed_buffer(1 << 20)
    dst = b.allocate_managed_buffer(1 << 20)
    assert src and dst
    assert a.write_bytes_to_buffer(src, b"mooncake", 8) == 0
    session = f"{HOST}:{b.get_rpc_port()}"
    rc = a.transfer_sync(session, src, dst, 8, TransferOpcode.Write, TransferNotify("prefill-0", "req-1"))
    assert rc == 0
    assert b.read_bytes_from_buffer(dst, 8) == b"mooncake"
    got = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got = b.get_notifies()
        time.sleep(0.01)
    assert [(n.name, n.msg) for n in got] == [("prefill-0", "req-1")]
    assert a.free_managed_buffer(src, 1 << 20) == 0
    assert a.free_managed_buffer(src, 1 << 20) < 0
    assert b.free_managed_buffer(dst, 1 << 20) == 0


def test_threads_share_one_compat_engine(engines):
    np = numpy_or_skip()
    a, b = engines(), engines()
    n, block = 8, 256 << 10
    src = np.zeros(n * block, np.uint8)
    dst = np.zeros_like(src)
    assert a.register_memory(src.ctypes.data, src.nbytes) == 0
    assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
    session = f"{HOST}:{b.get_rpc_port()}"
    rcs = []

    def work(i):
        lo = i * block
        for r in range(10):
            src[lo:lo + block] = i + r
            rcs.append(a.batch_transfer_sync_write(session, [src.ctypes.data + lo], [dst.ctypes.data + lo], [block]))
            rcs.append(int((dst[lo:lo + block] == i + r).all()) - 1)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert rcs and all(rc == 0 for rc in rcs)


def test_http_metadata_server(mooncake_bin):
    """initialize(name, "http://h:p/metadata", "tcp", ""): segment
    descriptors go through an HTTP metadata server (`mooncake metadata`),
    and peers open each other by the names they were given."""
    import subprocess

    np = numpy_or_skip()
    srv = subprocess.Popen([str(mooncake_bin), "metadata", "--port", "0", "--log-level", "error"],
                           stdout=subprocess.PIPE, text=True)
    try:
        url = srv.stdout.readline().strip()
        assert url.startswith("http://")
        # Names, not addresses: with a metadata server an engine publishes
        # the ports it bound (port 0) under its name, and peers look that
        # up, so nothing binds the ports in these names.
        names = [f"{HOST}:1001", f"{HOST}:1002"]
        a, b = TransferEngine(), TransferEngine()
        try:
            assert a.initialize(names[0], url, "tcp", "") == 0
            assert b.initialize(names[1], url, "tcp", "") == 0
            src = np.arange(8192, dtype=np.uint8)
            dst = np.zeros_like(src)
            assert a.register_memory(src.ctypes.data, src.nbytes) == 0
            assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
            assert a.transfer_sync_write(names[1], src.ctypes.data, dst.ctypes.data, src.nbytes) == 0
            assert np.array_equal(src, dst)
            assert a.get_first_buffer_address(names[1]) == dst.ctypes.data
        finally:
            a.close()
            b.close()
    finally:
        srv.terminate()
        srv.wait(timeout=10)
