"""Cross-implementation: our mooncake.engine.TransferEngine and the
official one (the PyPI wheel mooncake-transfer-engine-non-cuda, in
.venv-official, in a child process) write into and read from each other's
memory over TCP in P2PHANDSHAKE mode.

The official side is engine/testdata/official_peer.py (the peer the Go
interop tests drive): one JSON request per line on stdin, one reply per
line on stdout.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

from conftest import ROOT, numpy_or_skip

PEER = ROOT / "engine" / "testdata" / "official_peer.py"
PEER_SIZE = 8 << 20


class OfficialPeer:
    def __init__(self, python: str):
        env = dict(os.environ, MC_FORCE_TCP="1", MC_TRANSFER_TIMEOUT="5", PYTHONUNBUFFERED="1",
                   MC_TCP_BIND_ADDRESS="127.0.0.1")
        env.pop("MOONCAKE_GO_LIBRARY", None)
        env.pop("PYTHONPATH", None)  # the official package, not ours
        self.proc = subprocess.Popen([python, str(PEER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self.lock = threading.Lock()

    def call(self, cmd: str, timeout: float = 60, **kw) -> dict:
        with self.lock:
            self.proc.stdin.write(json.dumps(dict(kw, cmd=cmd)) + "\n")
            self.proc.stdin.flush()
            line = self._readline(timeout)
        rep = json.loads(line)
        if not rep.get("ok"):
            raise RuntimeError(f"official peer: {cmd}: {rep.get('error')}")
        return rep

    def _readline(self, timeout: float) -> str:
        out = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not out or not out[0]:
            raise RuntimeError("official peer did not answer")
        return out[0]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
        except Exception:
            pass
        if self.proc.poll() is None:  # its engine may linger: by pid
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def official(official_python):
    if not PEER.exists():
        pytest.skip(f"{PEER} is missing")
    p = OfficialPeer(official_python)
    try:
        info = p.call("init", metadata="P2PHANDSHAKE", host="127.0.0.1", name="", size=PEER_SIZE)
    except Exception as e:
        p.close()
        pytest.skip(f"the official engine did not start: {e}")
    p.info = info
    yield p
    p.close()


@pytest.fixture
def ours():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    yield te
    te.close()


def test_we_write_and_read_official_memory(official, ours):
    np = numpy_or_skip()
    data = np.random.default_rng(21).integers(0, 255, 3 << 20, dtype=np.uint8)
    back = np.zeros_like(data)
    assert ours.batch_register_memory([data.ctypes.data, back.ctypes.data], [data.nbytes, back.nbytes]) == 0
    seg, remote = official.info["segment"], official.info["addr"]
    # One large write, then a batch of 64 blocks at other offsets.
    assert ours.transfer_sync_write(seg, data.ctypes.data, remote, data.nbytes) == 0
    got = official.call("checksum", off=0, len=data.nbytes)["sha256"]
    assert got == hashlib.sha256(data.tobytes()).hexdigest()
    block = 16 << 10
    srcs = [data.ctypes.data + i * block for i in range(64)]
    dsts = [remote + (4 << 20) + i * block for i in range(64)]
    assert ours.batch_transfer_sync_write(seg, srcs, dsts, [block] * 64) == 0
    got = official.call("checksum", off=4 << 20, len=64 * block)["sha256"]
    assert got == hashlib.sha256(data[:64 * block].tobytes()).hexdigest()
    # Read it all back.
    assert ours.batch_transfer_sync_read(seg, [back.ctypes.data], [remote], [back.nbytes]) == 0
    assert np.array_equal(back, data)
    assert ours.get_first_buffer_address(seg) == remote
    # With a notification, which the official engine receives.
    n = TransferNotify("go-side", "done-1")
    assert ours.transfer_sync(seg, data.ctypes.data, remote, 4096, TransferOpcode.Write, n) == 0
    deadline = time.monotonic() + 10
    notes = []
    while not notes and time.monotonic() < deadline:
        notes = official.call("notifies")["notifies"]
        time.sleep(0.05)
    assert {"name": "go-side", "msg": "done-1"} in notes


def test_official_writes_and_reads_our_memory(official, ours):
    np = numpy_or_skip()
    target = np.zeros(4 << 20, np.uint8)
    assert ours.register_memory(target.ctypes.data, target.nbytes) == 0
    our_session = f"127.0.0.1:{ours.get_rpc_port()}"
    payload = np.random.default_rng(22).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
    # Fill the official buffer in 256 KiB pieces (one JSON line each).
    for off in range(0, len(payload), 256 << 10):
        official.call("put", off=off, data=base64.b64encode(payload[off:off + (256 << 10)]).decode())
    rep = official.call("write", segment=our_session, off=0, remote=target.ctypes.data, len=len(payload))
    assert rep["rc"] == 0
    assert target[:len(payload)].tobytes() == payload
    rep = official.call("batch_write", segment=our_session, offs=[0, 4096], remotes=[
        target.ctypes.data + (2 << 20), target.ctypes.data + (3 << 20)], lens=[4096, 4096])
    assert rep["rc"] == 0
    assert target[2 << 20:(2 << 20) + 4096].tobytes() == payload[:4096]
    assert target[3 << 20:(3 << 20) + 4096].tobytes() == payload[4096:8192]
    # The official engine reads our memory.
    target[:8192] = 0x5A
    rep = official.call("read", segment=our_session, off=1 << 20, remote=target.ctypes.data, len=8192)
    assert rep["rc"] == 0
    got = official.call("get", off=1 << 20, len=8192)["data"]
    assert base64.b64decode(got) == b"\x5a" * 8192
    # Outside our registered memory: the official engine gets an error.
    rep = official.call("write", segment=our_session, off=0, remote=4096, len=16)
    assert rep["rc"] < 0
