"""LMCache's "mooncake_te" transfer channel (the P2P channel of its
distributed L2 / P2P adapter) between two processes: tc_peer.py serves an
L1 pool of random objects, this process opens its own channel context and
reads them with the channel client (submit_read = our
batch_transfer_async_read, query_read_status = our transfer_check_status).

Runs with MC_TE_PROTOCOL=tcp (LMCache's default) and =rdma (what a GPU host
sets; our engine then picks its same-host path)."""

from __future__ import annotations

import ctypes
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tc_peer
from lmcharness import mismatches
from lmcache.v1.distributed.transfer_channel import (TransferChannelAddress, delete_transfer_channel_context,
                                                     initialize_transfer_channel_context)

from mccluster import free_port

HERE = Path(__file__).resolve().parent
WAIT = 120  # seconds: the peer's start (LMCache's import) or one read
# Remote objects 0 and 2 have the same size, so the test can read them
# crossed over: a transfer that mixed up descriptors shows as wrong bytes.
SIZES = [65536, 4096, 65536, 12288 + 512]
SENTINEL = 0xEE


class Peer:
    """A tc_peer.py process serving its channel on url; .catalog is its JSON line."""

    def __init__(self, url: str, log: Path):
        self.url = url
        self._log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "tc_peer.py"), url, *map(str, SIZES)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=WAIT)
        except queue.Empty:
            line = ""
        if not line:
            self.stop()
            pytest.fail(f"tc_peer.py did not start:\n{log.read_text()[-3000:]}")
        self.catalog = json.loads(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(params=["tcp", "rdma"])
def protocol(request, monkeypatch) -> str:
    monkeypatch.setenv("MC_TE_PROTOCOL", request.param)
    return request.param


@pytest.fixture
def peer(protocol, tmp_path):
    p = Peer(f"127.0.0.1:{free_port()}", tmp_path / "tc_peer.log")
    yield p
    assert p.stop() == 0, (tmp_path / "tc_peer.log").read_text()[-3000:]


@pytest.fixture
def local(protocol):
    """This process's L1 pool with one object per size, filled with SENTINEL,
    and its own mooncake_te channel context."""
    mgr = tc_peer.pool()
    objs = [tc_peer.allocate(mgr, n) for n in SIZES]
    base = mgr.get_l1_memory_desc().ptr
    for o, n in zip(objs, SIZES):
        ctypes.memset(base + o.shm_offset, SENTINEL, n)
    url = f"127.0.0.1:{free_port()}"
    ctx = initialize_transfer_channel_context("mooncake_te", l1_memory_desc=mgr.get_l1_memory_desc(),
                                              listen_url=url, advertise_url=url)
    yield ctx, [(base + o.shm_offset, o.shm_offset, n) for o, n in zip(objs, SIZES)]
    delete_transfer_channel_context()
    mgr.free(objs)
    mgr.close()


def expected(i: int) -> bytes:
    """What tc_peer.py wrote into its object i."""
    return random.Random(i).randbytes(SIZES[i])


def read(client, local_addrs, remote_addrs):
    """One read through LMCache's channel client, polled to the end as LMCache
    does; its succeeded_mask."""
    task = client.submit_read(local_addrs, remote_addrs)
    deadline = time.monotonic() + WAIT
    result = client.query_read_status(task)
    while not result.is_finished():
        assert time.monotonic() < deadline, "the read did not finish"
        time.sleep(0.001)  # a poll interval, not synchronisation
        result = client.query_read_status(task)
    return result.succeeded_mask


def test_read_between_processes(peer, local):
    ctx, mine = local
    remote = [TransferChannelAddress(offset=off, size=n) for off, n in peer.catalog["objects"]]
    addr = ctx.get_transfer_channel_address([(off, n) for _, off, n in mine])
    client = ctx.get_transfer_channel_client(peer.url)
    # local 0 <- remote 2, local 1 <- remote 1, local 2 <- remote 0; local 3 stays unread.
    assert read(client, [addr[0], addr[1], addr[2]], [remote[2], remote[1], remote[0]]) == [True] * 3
    got = [ctypes.string_at(ptr, n) for ptr, _, n in mine]
    assert mismatches(expected(2), got[0]) == 0
    assert mismatches(expected(1), got[1]) == 0
    assert mismatches(expected(0), got[2]) == 0
    # Negative control of the check: the object not read still holds the
    # sentinel, which the same comparison reports as different.
    assert got[3] == bytes([SENTINEL]) * SIZES[3]
    assert mismatches(expected(3), got[3]) > 0


def test_read_outside_registered_region_fails(peer, local):
    """Negative control: a read from past the end of the peer's registered
    pool is refused (the channel reports the object failed) and leaves the
    local object untouched."""
    ctx, mine = local
    addr = ctx.get_transfer_channel_address([(mine[1][1], mine[1][2])])
    client = ctx.get_transfer_channel_client(peer.url)
    outside = TransferChannelAddress(offset=peer.catalog["pool"], size=SIZES[1])
    assert read(client, addr, [outside]) == [False]
    assert ctypes.string_at(mine[1][0], SIZES[1]) == bytes([SENTINEL]) * SIZES[1]


def test_read_after_peer_exit_fails(peer, local):
    """Negative control: once the peer process has gone (its pool
    unregistered, its engine closed), a read from it fails."""
    ctx, mine = local
    addr = ctx.get_transfer_channel_address([(mine[1][1], mine[1][2])])
    client = ctx.get_transfer_channel_client(peer.url)
    remote = [TransferChannelAddress(offset=peer.catalog["objects"][1][0], size=SIZES[1])]
    assert read(client, addr, remote) == [True]
    ctypes.memset(mine[1][0], SENTINEL, SIZES[1])
    assert peer.stop() == 0
    try:
        mask = read(client, addr, remote)
    except RuntimeError as e:  # submit refused: LMCache raises on batch id 0
        mask = [False]
        assert "Failed to submit async read" in str(e)
    assert mask == [False]
    assert ctypes.string_at(mine[1][0], SIZES[1]) == bytes([SENTINEL]) * SIZES[1]
