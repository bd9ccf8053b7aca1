"""NIXL's Python agents, in two processes, moving DRAM through NIXL's own
Mooncake plugin on our libtransfer_engine.so.

Each test starts a target agent and an initiator agent (peer.py), hands the
target's agent metadata to the initiator through the test (the out-of-band
exchange a framework does over its own channel), transfers, and checks every
byte and every notification. Each runs on the default transport and with
MC_FORCE_TCP=1 (conftest.transport)."""

from __future__ import annotations

import base64
import os

import numpy as np
import pytest

SIZE = 1 << 20
# Four 128 KiB pieces, scattered and out of order on the remote side, so a
# transfer that mixed up descriptors or offsets shows as wrong bytes.
PIECE = 128 << 10
LOCAL_OFFSETS = [0, PIECE, 3 * PIECE, 6 * PIECE]
REMOTE_OFFSETS = [5 * PIECE, 0, 7 * PIECE, 2 * PIECE]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def mismatches(want: bytes, got: bytes) -> list[int]:
    """The offsets where got differs from want (a length difference counts
    from the shorter end)."""
    n = min(len(want), len(got))
    a, b = np.frombuffer(want, np.uint8, n), np.frombuffer(got, np.uint8, n)
    return np.flatnonzero(a != b).tolist() + list(range(n, max(len(want), len(got))))


def assert_same(want: bytes, got: bytes, what: str) -> None:
    bad = mismatches(want, got)
    assert not bad, f"{what}: {len(bad)} bytes differ, first at offset {bad[0]}"


def scatter(src: bytes, base: bytes) -> bytes:
    """base with the pieces of src at LOCAL_OFFSETS moved to REMOTE_OFFSETS."""
    out = bytearray(base)
    for lo, ro in zip(LOCAL_OFFSETS, REMOTE_OFFSETS):
        out[ro:ro + PIECE] = src[lo:lo + PIECE]
    return bytes(out)


def gather(remote: bytes, base: bytes) -> bytes:
    """base with the pieces of remote at REMOTE_OFFSETS put at LOCAL_OFFSETS."""
    out = bytearray(base)
    for lo, ro in zip(LOCAL_OFFSETS, REMOTE_OFFSETS):
        out[lo:lo + PIECE] = remote[ro:ro + PIECE]
    return bytes(out)


def connect(peers):
    """A target and an initiator that loaded the target's metadata."""
    target, initiator = peers("target", "initiator")
    assert target.ready["backends"] == ["MOONCAKE"], target.ready
    return target, initiator


def pieces(buf: str, remote_addr: int):
    local = [[buf, off, PIECE] for off in LOCAL_OFFSETS]
    remote = [[remote_addr + off, PIECE] for off in REMOTE_OFFSETS]
    return local, remote


def test_write_with_notification(peers):
    target, initiator = connect(peers)
    dst = target.call("alloc", name="dst", size=SIZE)
    initiator.call("alloc", name="src", size=SIZE)
    before = os.urandom(SIZE)
    data = os.urandom(SIZE)
    target.call("fill", name="dst", data=b64(before))
    initiator.call("fill", name="src", data=b64(data))
    assert initiator.call("add_remote", meta=target.call("metadata")["meta"])["agent"] == "target"

    local, remote = pieces("src", dst["addr"])
    rep = initiator.call("xfer", op="WRITE", local=local, remote=remote, peer="target",
                         notif=b64(b"write-done"))
    assert rep["state"] == "DONE", rep
    assert target.notifs(1) == {"initiator": [b"write-done"]}
    assert_same(scatter(data, before), target.dump("dst"), "target after WRITE")
    assert_same(data, initiator.dump("src"), "initiator's source after WRITE")

    # A notification on its own (NIXL genNotif -> genNotifyInEngine).
    initiator.call("send_notif", peer="target", msg=b64(b"standalone"))
    assert target.notifs(1) == {"initiator": [b"standalone"]}


def test_read_with_notification(peers):
    target, initiator = connect(peers)
    src = target.call("alloc", name="src", size=SIZE)
    initiator.call("alloc", name="dst", size=SIZE)
    data = os.urandom(SIZE)
    before = os.urandom(SIZE)
    target.call("fill", name="src", data=b64(data))
    initiator.call("fill", name="dst", data=b64(before))
    initiator.call("add_remote", meta=target.call("metadata")["meta"])

    local, remote = pieces("dst", src["addr"])
    rep = initiator.call("xfer", op="READ", local=local, remote=remote, peer="target",
                         notif=b64(b"read-done"))
    assert rep["state"] == "DONE", rep
    assert target.notifs(1) == {"initiator": [b"read-done"]}
    assert_same(gather(data, before), initiator.dump("dst"), "initiator after READ")
    assert_same(data, target.dump("src"), "target's source after READ")


def test_repeated_transfers_reuse_the_connection(peers):
    """Several transfers, both ways, on one loaded remote agent, each with
    its own notification in order."""
    target, initiator = connect(peers)
    buf = target.call("alloc", name="buf", size=SIZE)
    initiator.call("alloc", name="a", size=SIZE)
    initiator.call("add_remote", meta=target.call("metadata")["meta"])
    local, remote = pieces("a", buf["addr"])
    for i in range(3):
        data = os.urandom(SIZE)
        initiator.call("fill", name="a", data=b64(data))
        rep = initiator.call("xfer", op="WRITE", local=local, remote=remote, peer="target",
                             notif=b64(b"w%d" % i))
        assert rep["state"] == "DONE", rep
        initiator.call("fill", name="a", data=b64(bytes(SIZE)))
        rep = initiator.call("xfer", op="READ", local=local, remote=remote, peer="target",
                             notif=b64(b"r%d" % i))
        assert rep["state"] == "DONE", rep
        assert_same(gather(scatter(data, bytes(SIZE)), bytes(SIZE)), initiator.dump("a"),
                    f"round {i}")
        assert target.notifs(2) == {"initiator": [b"w%d" % i, b"r%d" % i]}


def test_region_registered_after_connect(peers):
    """The target registers a buffer after the initiator loaded its
    metadata and sends that buffer's partial metadata, as agents that grow
    their memory do; the initiator writes into it over the segment it
    opened before."""
    target, initiator = connect(peers)
    target.call("alloc", name="first", size=SIZE)
    initiator.call("alloc", name="src", size=SIZE)
    initiator.call("add_remote", meta=target.call("metadata")["meta"])

    late = target.call("alloc", name="late", size=SIZE)
    initiator.call("add_remote", meta=target.call("partial_metadata", name="late")["meta"])
    data = os.urandom(SIZE)
    initiator.call("fill", name="src", data=b64(data))
    local, remote = pieces("src", late["addr"])
    rep = initiator.call("xfer", op="WRITE", local=local, remote=remote, peer="target",
                         notif=b64(b"late"))
    assert rep["state"] == "DONE", rep
    assert target.notifs(1) == {"initiator": [b"late"]}
    assert_same(scatter(data, bytes(SIZE)), target.dump("late"), "late-registered buffer")


# Negative controls.

def test_never_registered_region_is_refused(peers):
    """A transfer to target memory that was never registered fails (NIXL
    finds no registered region for it, before the plugin is asked) and
    leaves that memory alone."""
    target, initiator = connect(peers)
    target.call("alloc", name="reg", size=SIZE)
    hidden = target.call("alloc", name="hidden", size=SIZE, register=False)
    initiator.call("alloc", name="src", size=SIZE)
    initiator.call("fill", name="src", data=b64(os.urandom(SIZE)))
    initiator.call("add_remote", meta=target.call("metadata")["meta"])

    local, remote = pieces("src", hidden["addr"])
    rep = initiator.call("xfer", op="WRITE", local=local, remote=remote, peer="target",
                         notif=b64(b"must-not-arrive"))
    # NIXL's core checks remote descriptors against the peer's metadata.
    assert rep["state"] == "RAISED" and "NIXL_ERR_NOT_FOUND" in rep["detail"], rep
    assert target.dump("hidden") == bytes(SIZE)
    assert target.notifs(1, timeout=1) == {}


@pytest.mark.parametrize("op", ["WRITE", "READ"])
def test_deregistered_region_is_refused(peers, op):
    """The target deregisters a buffer after the initiator loaded metadata
    that still lists it: NIXL passes the request to the plugin, so our
    engine is what must refuse it. The memory stays allocated, so a
    transfer that went through would show in the bytes."""
    target, initiator = connect(peers)
    gone = target.call("alloc", name="gone", size=SIZE)
    secret = os.urandom(SIZE)
    target.call("fill", name="gone", data=b64(secret))
    initiator.call("alloc", name="buf", size=SIZE)
    initiator.call("fill", name="buf", data=b64(bytes(SIZE)))
    initiator.call("add_remote", meta=target.call("metadata")["meta"])
    target.call("deregister", name="gone")

    local, remote = pieces("buf", gone["addr"])
    rep = initiator.call("xfer", op=op, local=local, remote=remote, peer="target",
                         notif=b64(b"must-not-arrive"), timeout=30)
    # Refused by the plugin (postXfer or checkXfer), that is by our engine.
    assert rep["state"] == "ERR" or "NIXL_ERR_BACKEND" in rep.get("detail", ""), rep
    assert target.dump("gone") == secret
    assert initiator.dump("buf") == bytes(SIZE)


def test_verification_detects_wrong_data(peers):
    """The byte-for-byte check above catches a single wrong byte: after a
    good WRITE, one byte of the target's copy is changed behind the
    transfer's back and the check must name exactly that offset."""
    target, initiator = connect(peers)
    dst = target.call("alloc", name="dst", size=SIZE)
    initiator.call("alloc", name="src", size=SIZE)
    data = os.urandom(SIZE)
    initiator.call("fill", name="src", data=b64(data))
    initiator.call("add_remote", meta=target.call("metadata")["meta"])
    local, remote = pieces("src", dst["addr"])
    assert initiator.call("xfer", op="WRITE", local=local, remote=remote,
                          peer="target")["state"] == "DONE"
    want = scatter(data, bytes(SIZE))
    assert mismatches(want, target.dump("dst")) == []

    at = REMOTE_OFFSETS[2] + 12345
    target.call("fill", name="dst", offset=at, data=b64(bytes([want[at] ^ 0x5A])))
    assert mismatches(want, target.dump("dst")) == [at]
    with pytest.raises(AssertionError, match=f"1 bytes differ, first at offset {at}"):
        assert_same(want, target.dump("dst"), "corrupted copy")
