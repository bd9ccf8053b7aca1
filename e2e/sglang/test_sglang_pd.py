"""SGLang's PD-disaggregation transfer wrapper, MooncakeTransferEngine
(sglang.srt.distributed.device_communicators.mooncake_transfer_engine), between
two processes: this one plays the prefill side, pd_peer.py the decode side.
The wrapper initializes our engine with P2PHANDSHAKE and MOONCAKE_PROTOCOL,
registers memory, writes KV with batch_transfer_sync / transfer_sync and
probes the peer with send_probe, the calls MooncakeKVManager makes; the bytes
are checked in the peer's memory."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from sgl_harness import HERE, sglang_env

from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import MooncakeTransferEngine

SIZE = 64 << 10


class Peer:
    """pd_peer.py in its own process."""

    def __init__(self):
        env = sglang_env("")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "pd_peer.py"), str(SIZE)], env=env, cwd=HERE,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            pytest.fail(f"pd_peer.py exited ({self.proc.returncode}) before it was ready")
        info = json.loads(line)
        self.session_id, self.ptr, self.rc = info["session_id"], info["ptr"], info["rc"]

    def dump(self) -> bytes:
        self.proc.stdin.write("dump\n")
        self.proc.stdin.flush()
        return bytes.fromhex(self.proc.stdout.readline().strip())

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def peer():
    p = Peer()
    yield p
    p.stop()


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")  # SGLang's default is "rdma"
    return MooncakeTransferEngine(hostname="127.0.0.1", gpu_id=0, ib_device=None)


def test_write_and_probe(engine, peer):
    assert peer.rc == 0, "the peer's batch_register failed"
    assert engine.get_session_id().startswith("127.0.0.1:")
    src = (ctypes.c_ubyte * SIZE).from_buffer_copy(os.urandom(SIZE))
    base = ctypes.addressof(src)
    engine.register(base, SIZE)
    try:
        assert engine.send_probe(peer.session_id) == 0
        # Three KV chunks to scattered places of the peer's buffer, then one
        # more with the single-request call.
        chunks = [(0, 1000, 4096), (4096, 20000, 4096), (8192, 40000, 1000)]
        assert engine.batch_transfer_sync(peer.session_id, [base + s for s, _, _ in chunks],
                                          [peer.ptr + d for _, d, _ in chunks], [n for _, _, n in chunks]) == 0
        assert engine.transfer_sync(peer.session_id, base + 12288, peer.ptr + 50000, 512) >= 0
        chunks.append((12288, 50000, 512))
        want = bytearray(SIZE)
        for s, d, n in chunks:
            want[d:d + n] = bytes(src)[s:s + n]
        assert peer.dump() == want

        # Negative controls: writes past the peer's registered buffer, wholly
        # or in part, are refused, and the peer's memory stays as it was.
        assert engine.batch_transfer_sync(peer.session_id, [base], [peer.ptr + SIZE + (1 << 20)], [4096]) < 0
        assert engine.batch_transfer_sync(peer.session_id, [base, base], [peer.ptr, peer.ptr + SIZE - 100],
                                          [64, 4096]) < 0
        assert engine.transfer_sync(peer.session_id, base, peer.ptr - 4096, 64) < 0
        got = peer.dump()
        assert got[64:] == bytes(want)[64:]
        # The first request of the refused batch was valid and may have landed.
        assert got[:64] in (bytes(want)[:64], bytes(src)[:64])

        # A peer that has gone does not answer the probe.
        peer.stop()
        assert engine.send_probe(peer.session_id) != 0
    finally:
        engine.deregister(base)
