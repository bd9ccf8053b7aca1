"""MOONCAKE_STORE (connectors/nixl): Mooncake Store as NIXL object storage,
through the nixl-cu12 wheel's own Python agent with the plugin loaded from
NIXL_PLUGIN_DIR, against `mooncake up`. Objects are written from numpy DRAM
buffers and read back into other buffers, every byte checked."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from mccluster import free_port, start_cluster
from store_agent import StoreAgent, build_store_plugin, check_bytes

nixl_bindings = pytest.importorskip("nixl._bindings")


@pytest.fixture(scope="module", autouse=True)
def plugin_dir():
    """NIXL's plugin manager reads NIXL_PLUGIN_DIR once, when the first
    agent of the process starts: it holds only our plugin (no UCX, which
    needs libcuda)."""
    d = build_store_plugin()
    old = os.environ.get("NIXL_PLUGIN_DIR")
    os.environ["NIXL_PLUGIN_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("NIXL_PLUGIN_DIR", None)
    else:
        os.environ["NIXL_PLUGIN_DIR"] = old


_names = iter(range(1 << 30))


@pytest.fixture
def agent(cluster, request):
    """A fresh agent on the module's cluster; its client adds no memory to
    the pool (global_segment_size -1), so every byte crosses to the storage
    node of `mooncake up`."""
    a = StoreAgent(f"store-{request.node.name}-{next(_names)}",
                   params={"master_server_address": cluster.master, "global_segment_size": "-1",
                           "local_buffer_size": "16MiB"})
    yield a
    a.close()


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


# Sizes with odd lengths and one past a 1 MiB slice.
SIZES = [1, 4095, 65536, (1 << 20) + 3]


def test_write_then_read_back(agent, request):
    """WRITE of four objects from scattered pieces of one DRAM buffer, READ
    into another buffer in a different order, byte for byte."""
    keys = [f"{request.node.name}/{i}" for i in range(len(SIZES))]
    src = pattern(sum(SIZES) + 4096, 1)
    dst = np.zeros_like(src)
    agent.register_dram(src)
    agent.register_dram(dst)
    devs = agent.register_objects(keys, SIZES)
    offs = np.cumsum([0] + SIZES[:-1]) + 7
    pieces = [(src.ctypes.data + int(o), n) for o, n in zip(offs, SIZES)]
    assert agent.run(agent.xfer("WRITE", pieces, [(0, d) for d in devs])) == "DONE"

    order = [3, 1, 0, 2]
    at = 0
    back = []
    for i in order:
        back.append((dst.ctypes.data + at, SIZES[i]))
        at += SIZES[i]
    assert agent.run(agent.xfer("READ", back, [(0, devs[i]) for i in order])) == "DONE"
    at = 0
    for i in order:
        check_bytes(dst[at:at + SIZES[i]], src[offs[i]:offs[i] + SIZES[i]], keys[i])
        at += SIZES[i]


def test_read_inside_an_object(agent, request):
    """A READ descriptor's address is an offset in the object: a piece from
    the middle and the last byte."""
    key = request.node.name
    src = pattern(1 << 20, 2)
    dst = np.zeros(4096 + 1, dtype=np.uint8)
    agent.register_dram(src)
    agent.register_dram(dst)
    (dev,) = agent.register_objects([key], [src.nbytes])
    assert agent.run(agent.xfer("WRITE", [(src.ctypes.data, src.nbytes)], [(0, dev)])) == "DONE"
    pieces = [(dst.ctypes.data, 4096), (dst.ctypes.data + 4096, 1)]
    assert agent.run(agent.xfer("READ", pieces, [(300001, dev), (src.nbytes - 1, dev)])) == "DONE"
    check_bytes(dst[:4096], src[300001:300001 + 4096], "middle piece")
    check_bytes(dst[4096:], src[-1:], "last byte")


def test_write_replaces_an_object(agent, request):
    """A second WRITE of a key replaces its value (object semantics), and a
    reused prepared handle moves the new bytes."""
    key = request.node.name
    buf = pattern(65536, 3)
    dst = np.zeros_like(buf)
    agent.register_dram(buf)
    agent.register_dram(dst)
    (dev,) = agent.register_objects([key], [buf.nbytes])
    w = agent.xfer("WRITE", [(buf.ctypes.data, buf.nbytes)], [(0, dev)])
    r = agent.xfer("READ", [(dst.ctypes.data, dst.nbytes)], [(0, dev)])
    for seed in (4, 5):
        buf[:] = pattern(buf.nbytes, seed)
        assert agent.run(w) == "DONE"
        assert agent.run(r) == "DONE"
        check_bytes(dst, buf, f"value {seed}")


def test_query_mem(agent, request):
    """queryMem answers per key: a dict for an object that exists, None for
    one that does not, in the order asked."""
    key = request.node.name
    buf = pattern(1000, 6)
    agent.register_dram(buf)
    (dev,) = agent.register_objects([key], [buf.nbytes])
    assert agent.query([key, key + "/missing"]) == [None, None]
    assert agent.run(agent.xfer("WRITE", [(buf.ctypes.data, buf.nbytes)], [(0, dev)])) == "DONE"
    assert agent.query([key + "/missing", key, key]) == [None, {}, {}]


def test_read_of_missing_key_fails_cleanly(agent, request):
    """A READ of a key nobody wrote ends in NIXL_ERR_NOT_FOUND, leaves the destination as
    it was, and the agent keeps working: a READ of a present key after it
    succeeds."""
    key = request.node.name
    buf = pattern(8192, 7)
    dst = np.full(8192, 0xA5, dtype=np.uint8)
    agent.register_dram(buf)
    agent.register_dram(dst)
    present, missing = agent.register_objects([key, key + "/never-written"], [8192, 8192])
    with pytest.raises(nixl_bindings.nixlNotFoundError):
        agent.run(agent.xfer("READ", [(dst.ctypes.data, 8192)], [(0, missing)]))
    check_bytes(dst, np.full(8192, 0xA5, dtype=np.uint8), "destination after a failed read")

    assert agent.run(agent.xfer("WRITE", [(buf.ctypes.data, 8192)], [(0, present)])) == "DONE"
    assert agent.run(agent.xfer("READ", [(dst.ctypes.data, 8192)], [(0, present)])) == "DONE"
    check_bytes(dst, buf, "read after the failed one")


def test_read_past_the_end_fails(agent, request):
    """A READ reaching past an object's end fails (NIXL_ERR_BACKEND; no short
    read)."""
    key = request.node.name
    buf = pattern(4096, 8)
    dst = np.zeros(4096, dtype=np.uint8)
    agent.register_dram(buf)
    agent.register_dram(dst)
    (dev,) = agent.register_objects([key], [8192])
    assert agent.run(agent.xfer("WRITE", [(buf.ctypes.data, 4096)], [(0, dev)])) == "DONE"
    with pytest.raises(nixl_bindings.nixlBackendError):
        agent.run(agent.xfer("READ", [(dst.ctypes.data, 4096)], [(1, dev)]))


def test_write_at_an_offset_is_refused(agent, request):
    """Objects are written whole: a WRITE into the middle of one is refused
    when the transfer is prepared."""
    buf = pattern(4096, 9)
    agent.register_dram(buf)
    (dev,) = agent.register_objects([request.node.name], [8192])
    with pytest.raises(nixl_bindings.nixlNotSupportedError):
        agent.xfer("WRITE", [(buf.ctypes.data, 4096)], [(4096, dev)])


def test_negative_controls(agent, request):
    """The checks can fail. (1) The byte check names the exact offset of one
    byte flipped in the stored value. (2) A buffer never registered with the
    agent is refused by NIXL before the plugin sees it."""
    key = request.node.name
    buf = pattern(65536, 10)
    want = buf.copy()
    dst = np.zeros_like(buf)
    agent.register_dram(buf)
    agent.register_dram(dst)
    (dev,) = agent.register_objects([key], [buf.nbytes])
    buf[12345] ^= 0x40
    assert agent.run(agent.xfer("WRITE", [(buf.ctypes.data, buf.nbytes)], [(0, dev)])) == "DONE"
    assert agent.run(agent.xfer("READ", [(dst.ctypes.data, dst.nbytes)], [(0, dev)])) == "DONE"
    with pytest.raises(AssertionError, match="1 bytes differ, the first at offset 12345"):
        check_bytes(dst, want, key)

    stray = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(nixl_bindings.nixlNotFoundError):
        agent.xfer("READ", [(stray.ctypes.data, 4096)], [(0, dev)])


@pytest.mark.parametrize("checksum", [None, "false"])
def test_checksum_parameter(cluster, request, checksum):
    """Objects are written with their CRC-32C unless checksum is "false":
    one byte flipped in the stored value (through the transfer engine, as
    a stray write would) makes a whole-object get of a store client fail
    with CHECKSUM_MISMATCH by default, and go through, flipped byte and
    all, for an object written without a checksum. The backend's own
    ranged reads read both."""
    from mooncake_go import Store, TransferEngine, errors

    params = {"master_server_address": cluster.master, "global_segment_size": "-1", "local_buffer_size": "16MiB"}
    if checksum is not None:
        params["checksum"] = checksum
    a = StoreAgent(f"ck-{next(_names)}", params=params)
    try:
        key = f"{request.node.name}-{time.monotonic_ns()}"
        buf, dst = pattern(8192, 11), np.zeros(8192, dtype=np.uint8)
        a.register_dram(buf)
        a.register_dram(dst)
        (dev,) = a.register_objects([key], [buf.nbytes])
        assert a.run(a.xfer("WRITE", [(buf.ctypes.data, buf.nbytes)], [(0, dev)])) == "DONE"
        with TransferEngine(host="127.0.0.1") as eng, Store(cluster.master, segment_size=-1) as raw:
            (rep,) = [r for r in raw.replicas(key) if r["kind"] == "memory"]
            one = bytearray(1)
            eng.register_memory(one)
            seg = eng.open_segment(rep["segment_name"])
            eng.read(seg, one, rep["buffer_address"] + 77)
            one[0] ^= 0xFF
            eng.write(seg, one, rep["buffer_address"] + 77)
            eng.unregister_memory(one)
            want = buf.copy()
            want[77] ^= 0xFF
            if checksum is None:
                with pytest.raises(errors.StoreError) as bad:
                    raw.get(key)
                assert bad.value.code == -801, bad.value  # MC_STORE_ERR_CHECKSUM_MISMATCH
            else:
                assert raw.get(key) == want.tobytes()
        assert a.run(a.xfer("READ", [(dst.ctypes.data, dst.nbytes)], [(0, dev)])) == "DONE"
        check_bytes(dst, want, key)
    finally:
        a.close()


def test_backend_parameters_are_checked(cluster):
    """A backend with no master, a size that is not one, or a checksum
    that is neither true nor false fails to start (NIXL_ERR_BACKEND),
    saying why on stderr."""
    for params in ({}, {"master_server_address": cluster.master, "global_segment_size": "-1x"},
                   {"master_server_address": cluster.master, "rpc_timeout_ms": "2s"},
                   {"master_server_address": cluster.master, "checksum": "no"}):
        env_master = os.environ.pop("MOONCAKE_MASTER", None)
        try:
            with pytest.raises(nixl_bindings.nixlBackendError):
                StoreAgent(f"bad-{next(_names)}", params=params)
        finally:
            if env_master is not None:
                os.environ["MOONCAKE_MASTER"] = env_master


def test_store_restart(mooncake_bin, request):
    """`mooncake up` stops: transfers and queries report errors (no hang,
    no crash). It comes back on the same address: the same agent, with the
    same registrations and prepared handles, writes and reads again."""
    port = free_port()
    args = ("--no-ha", "--nodes", "1", "--global_segment_size", "256MiB", "--rpc_port", str(port))
    c = start_cluster(mooncake_bin, *args)
    a = None
    handles = []
    try:
        # rpc_timeout_ms: a call to the master that is down fails in 2 s,
        # not the default 30 s.
        a = StoreAgent(f"restart-{next(_names)}",
                       params={"master_server_address": c.master, "global_segment_size": "-1",
                               "local_buffer_size": "16MiB", "rpc_timeout_ms": "2000"})
        buf = pattern(1 << 20, 11)
        dst = np.zeros_like(buf)
        a.register_dram(buf)
        a.register_dram(dst)
        (dev,) = a.register_objects([request.node.name], [buf.nbytes])
        w = a.xfer("WRITE", [(buf.ctypes.data, buf.nbytes)], [(0, dev)])
        r = a.xfer("READ", [(dst.ctypes.data, dst.nbytes)], [(0, dev)])
        handles += [w, r]
        assert a.run(w) == "DONE"

        c.stop()
        for h in (w, r):
            with pytest.raises(nixl_bindings.nixlBackendError):
                a.run(h)
        with pytest.raises(nixl_bindings.nixlBackendError):
            a.query([request.node.name])

        c = start_cluster(mooncake_bin, *args)
        # The storage node mounts its segment once up is ready; until the
        # client's connection and the pool are back, a write may fail.
        deadline = time.monotonic() + 60
        while True:
            try:
                a.run(w)
                break
            except nixl_bindings.nixlBackendError as e:
                assert time.monotonic() < deadline, f"no successful write within 60 s of the restart ({e})"
                time.sleep(0.2)
        assert a.query([request.node.name]) == [{}]
        assert a.run(r) == "DONE"
        check_bytes(dst, buf, "after the restart")
    finally:
        # Handles keep the agent alive: release them so that its store
        # client closes (unmounts) while the master is up.
        for h in handles:
            h.release()
        if a is not None:
            a.close()
        c.stop()
