"""A peer driven by the Go interop tests: the official Mooncake Transfer
Engine (mooncake.engine.TransferEngine, from the PyPI wheel) behind a tiny
line-delimited JSON protocol on stdin/stdout.

Every request is one JSON object on one line with a "cmd" field; every reply
is one JSON object on one line, {"ok": true, ...} or {"ok": false, "error":
...}. Transfer calls report the engine's own return code in "rc" (0 on
success, negative on failure) and are not errors of this protocol.

Commands:
  init      {metadata, host, name, size}  start the engine; allocate and
            register `size` bytes of anonymous memory.
            -> {segment, addr, size, rpc_port}
  put       {off, data(base64)}           copy bytes into the buffer
  get       {off, len}                    -> {data(base64)}
  checksum  {off, len}                    -> {sha256(hex)}
  write     {segment, off, remote, len, notify?: {name, msg}}  -> {rc}
  read      {segment, off, remote, len}   -> {rc}
  batch_write / batch_read {segment, offs[], remotes[], lens[]} -> {rc}
  notifies  {}                            -> {notifies: [{name, msg}]}
  probe     {segment}                     -> {rc}
  first_buffer {segment}                  -> {addr}
  quit      {}

The engine's native code may print to stdout; fd 1 is pointed at stderr at
start so that only replies travel on the protocol pipe.
"""

import base64
import ctypes
import hashlib
import json
import mmap
import os
import sys
import traceback

# Keep the protocol pipe private before the native library is loaded.
_proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode  # noqa: E402

state = {}


def view(off, n):
    buf, size = state["buf"], state["size"]
    if off < 0 or n < 0 or off + n > size:
        raise ValueError(f"range {off}+{n} outside the {size}-byte buffer")
    return memoryview(buf)[off:off + n]


def local(off, n):
    view(off, n)  # bounds check only
    return state["addr"] + off


def cmd_init(req):
    te = TransferEngine()
    metadata = req["metadata"]
    if metadata == "P2PHANDSHAKE":
        rc = te.initialize(req["host"], metadata, "tcp", "")
    else:
        rc = te.initialize(req["name"], metadata, "tcp", "")
    if rc != 0:
        raise RuntimeError(f"initialize returned {rc}")
    size = int(req["size"])
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    rc = te.register_memory(addr, size)
    if rc != 0:
        raise RuntimeError(f"register_memory returned {rc}")
    if metadata == "P2PHANDSHAKE":
        segment = f"{req['host']}:{te.get_rpc_port()}"
    else:
        segment = req["name"]
    state.update(te=te, buf=buf, addr=addr, size=size)
    return {"segment": segment, "addr": addr, "size": size, "rpc_port": te.get_rpc_port()}


def cmd_put(req):
    data = base64.b64decode(req["data"])
    view(req["off"], len(data))[:] = data
    return {}


def cmd_get(req):
    return {"data": base64.b64encode(bytes(view(req["off"], req["len"]))).decode()}


def cmd_checksum(req):
    return {"sha256": hashlib.sha256(view(req["off"], req["len"])).hexdigest()}


def cmd_write(req):
    te = state["te"]
    src = local(req["off"], req["len"])
    if req.get("notify"):
        n = TransferNotify(req["notify"]["name"], req["notify"]["msg"])
        rc = te.transfer_sync(req["segment"], src, req["remote"], req["len"], TransferOpcode.Write, n)
    else:
        rc = te.transfer_sync_write(req["segment"], src, req["remote"], req["len"])
    return {"rc": rc}


def cmd_read(req):
    dst = local(req["off"], req["len"])
    return {"rc": state["te"].transfer_sync_read(req["segment"], dst, req["remote"], req["len"])}


def batch(req, fn):
    offs, remotes, lens = req["offs"], req["remotes"], req["lens"]
    if not (len(offs) == len(remotes) == len(lens)):
        raise ValueError("offs, remotes and lens differ in length")
    bufs = [local(o, n) for o, n in zip(offs, lens)]
    return {"rc": fn(req["segment"], bufs, remotes, lens)}


def cmd_batch_write(req):
    return batch(req, state["te"].batch_transfer_sync_write)


def cmd_batch_read(req):
    return batch(req, state["te"].batch_transfer_sync_read)


def cmd_notifies(req):
    return {"notifies": [{"name": n.name, "msg": n.msg} for n in state["te"].get_notifies()]}


def cmd_probe(req):
    return {"rc": state["te"].send_probe(req["segment"])}


def cmd_first_buffer(req):
    return {"addr": state["te"].get_first_buffer_address(req["segment"])}


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if req["cmd"] == "quit":
                _proto.write(json.dumps({"ok": True}) + "\n")
                break
            fn = globals().get("cmd_" + req["cmd"])
            if fn is None:
                raise ValueError(f"unknown command {req['cmd']!r}")
            if fn is not cmd_init and "te" not in state:
                raise RuntimeError("init first")
            rep = fn(req)
            rep["ok"] = True
        except Exception as e:  # report, keep serving
            traceback.print_exc()
            rep = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        _proto.write(json.dumps(rep) + "\n")
    # The engine's destructor may block on its threads; the Go side kills us
    # by pid if we linger.
    os._exit(0)


if __name__ == "__main__":
    main()
