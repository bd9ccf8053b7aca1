"""One NIXL agent in a process of its own, driven by the test over a pipe.

Usage: python peer.py AGENT_NAME. The agent is NIXL's own Python API
(``nixl._api.nixl_agent``) with ``backends=["MOONCAKE"]``: NIXL's Mooncake
plugin, found through NIXL_PLUGIN_DIR, on our libtransfer_engine.so. Buffers
are numpy arrays passed to NIXL as (addr, len, dev, meta) tuples of memory
type "DRAM", as a framework on a CPU host does.

Protocol: one JSON object per line on stdin, one reply per line on the
original stdout (fd 1 itself is pointed at stderr, so nothing the native
libraries print can corrupt a reply). Bytes travel base64-encoded. A reply
is {"ok": true, ...} or {"ok": false, "error": "..."}; the first line
written, unasked, is the agent's readiness.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import traceback

import numpy as np

b64 = lambda b: base64.b64encode(bytes(b)).decode()  # noqa: E731
unb64 = base64.b64decode


class Peer:
    def __init__(self, name: str):
        from nixl._api import nixl_agent, nixl_agent_config

        self.name = name
        self.agent = nixl_agent(name, nixl_agent_config(backends=["MOONCAKE"]))
        if "MOONCAKE" not in self.agent.backends:
            raise RuntimeError(f"MOONCAKE backend not created; plugins: {self.agent.get_plugin_list()}")
        self.bufs: dict[str, np.ndarray] = {}
        self.regs: dict[str, object] = {}

    def ready(self) -> dict:
        return {"plugins": self.agent.get_plugin_list(), "backends": list(self.agent.backends)}

    def _addr(self, name: str) -> int:
        return self.bufs[name].ctypes.data

    def alloc(self, name: str, size: int, register: bool = True) -> dict:
        """A zeroed buffer, registered with NIXL unless asked not to."""
        self.bufs[name] = np.zeros(size, dtype=np.uint8)
        if register:
            self.register(name)
        return {"addr": self._addr(name), "len": size}

    def register(self, name: str) -> dict:
        buf = self.bufs[name]
        self.regs[name] = self.agent.register_memory([(self._addr(name), buf.nbytes, 0, "")], "DRAM")
        return {}

    def deregister(self, name: str) -> dict:
        self.agent.deregister_memory(self.regs.pop(name))
        return {}

    def fill(self, name: str, data: str, offset: int = 0) -> dict:
        raw = np.frombuffer(unb64(data), dtype=np.uint8)
        self.bufs[name][offset:offset + raw.size] = raw
        return {}

    def dump(self, name: str) -> dict:
        return {"data": b64(self.bufs[name].tobytes())}

    def metadata(self) -> dict:
        return {"meta": b64(self.agent.get_agent_metadata())}

    def partial_metadata(self, name: str) -> dict:
        """The metadata of one registered buffer, for a peer that already
        loaded this agent's full metadata earlier."""
        return {"meta": b64(self.agent.get_partial_agent_metadata(self.regs[name], False))}

    def add_remote(self, meta: str) -> dict:
        name = self.agent.add_remote_agent(unb64(meta))
        return {"agent": name.decode() if isinstance(name, bytes) else name}

    def xfer(self, op: str, local: list, remote: list, peer: str, notif: str = "",
             timeout: float = 60) -> dict:
        """One transfer: local = [[buffer, offset, len], ...] against remote =
        [[addr, len], ...], posted and polled to its end. state is DONE or
        ERR as NIXL reports them, or RAISED when NIXL refused the request."""
        ldescs = [(self._addr(b) + off, n, 0) for b, off, n in local]
        rdescs = [(a, n, 0) for a, n in remote]
        try:
            h = self.agent.initialize_xfer(op, self.agent.get_xfer_descs(ldescs, "DRAM"),
                                           self.agent.get_xfer_descs(rdescs, "DRAM"), peer,
                                           unb64(notif))
        except Exception as e:  # nixl raises its own status errors here
            return {"state": "RAISED", "detail": f"{type(e).__name__}: {e}"}
        try:
            state = self.agent.transfer(h)
            deadline = time.monotonic() + timeout
            while state == "PROC":
                if time.monotonic() > deadline:
                    return {"state": "TIMEOUT"}
                time.sleep(0.001)  # polling the transfer's status, as NIXL's API asks
                state = self.agent.check_xfer_state(h)
        except Exception as e:
            return {"state": "RAISED", "detail": f"{type(e).__name__}: {e}"}
        finally:
            self.agent.release_xfer_handle(h)
        return {"state": state}

    def send_notif(self, peer: str, msg: str) -> dict:
        self.agent.send_notif(peer, unb64(msg))
        return {}

    def notifs(self, count: int, timeout: float = 30) -> dict:
        """Notifications as they arrive, until COUNT of them or TIMEOUT:
        {agent: [message, ...]}."""
        got: dict[str, list[str]] = {}
        n = 0
        deadline = time.monotonic() + timeout
        while n < count and time.monotonic() < deadline:
            for agent, msgs in self.agent.get_new_notifs().items():
                got.setdefault(agent, []).extend(b64(m) for m in msgs)
                n += len(msgs)
            if n < count:
                time.sleep(0.001)  # polling the notification queue, as NIXL's API asks
        return {"notifs": got}


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")

    try:
        peer = Peer(sys.argv[1])
        reply({"ok": True, **peer.ready()})
    except Exception:
        reply({"ok": False, "error": traceback.format_exc()})
        return
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req.pop("cmd")
        if cmd == "exit":
            reply({"ok": True})
            break
        try:
            reply({"ok": True, **getattr(peer, cmd)(**req)})
        except Exception:
            reply({"ok": False, "error": traceback.format_exc()})
    out.flush()


if __name__ == "__main__":
    main()
