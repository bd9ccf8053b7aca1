"""A NIXL agent on the MOONCAKE_STORE backend (connectors/nixl), driven the
way a NIXL user drives an object backend: DRAM buffers and OBJ descriptors
(key in metaInfo) registered with the agent, loopback READ/WRITE transfers
between them. Shared by test_store_backend.py and bench_store_backend.py."""

from __future__ import annotations

import gc
import os
import subprocess
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
XFER_TIMEOUT = 60  # seconds for one transfer to end, DONE or ERR


def build_store_plugin() -> Path:
    """Builds the plugin (connectors/nixl/build.sh) and returns the folder
    that holds it, for NIXL_PLUGIN_DIR."""
    env = dict(os.environ)
    env.setdefault("MOONCAKE_LIB_DIR", str(ROOT / "build"))
    r = subprocess.run(["bash", str(ROOT / "connectors" / "nixl" / "build.sh")], env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"connectors/nixl/build.sh failed ({r.returncode}):\n{r.stderr}")
    return Path(r.stdout.strip().splitlines()[-1]) / "plugins"


def wait(agent, handle, timeout: float = XFER_TIMEOUT) -> str:
    """Polls a posted transfer until it ends; returns "DONE" (NIXL's Python
    API raises the error of a failed one: nixlNotFoundError, ...)."""
    deadline = time.monotonic() + timeout
    while (state := agent.check_xfer_state(handle)) == "PROC":
        if time.monotonic() > deadline:
            raise TimeoutError(f"transfer still in progress after {timeout} s")
        time.sleep(0.0005)
    return state


def check_bytes(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Fails naming the first offset where got differs from want."""
    assert got.nbytes == want.nbytes, f"{what}: {got.nbytes} bytes, want {want.nbytes}"
    diff = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
    if diff.size:
        i = int(diff[0])
        raise AssertionError(f"{what}: {diff.size} bytes differ, the first at offset {i} "
                             f"(got {got.view(np.uint8)[i]}, want {want.view(np.uint8)[i]})")


class StoreAgent:
    """One nixl_agent with one backend: MOONCAKE_STORE (params go to
    create_backend) or any other object-capable one (POSIX with FILE)."""

    def __init__(self, name: str, backend: str = "MOONCAKE_STORE", params: dict | None = None,
                 remote_type: str = "OBJ"):
        from nixl._api import nixl_agent, nixl_agent_config

        self.name = name
        self.backend = backend
        self.remote_type = remote_type
        self.agent = nixl_agent(name, nixl_agent_config(backends=[]))
        self.agent.create_backend(backend, params or {})
        self._regs: list = []
        self._dev = 0

    def register_dram(self, buf: np.ndarray) -> None:
        self._regs.append(self.agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM"))

    def register_objects(self, names: list[str], sizes: list[int]) -> list[int]:
        """Registers one remote descriptor per name (an object key, or for
        FILE a file descriptor as devId) and returns their devIds."""
        devs = []
        descs = []
        for n, size in zip(names, sizes):
            self._dev += 1
            dev = int(n) if self.remote_type == "FILE" else self._dev
            devs.append(dev)
            descs.append((0, size, dev, "" if self.remote_type == "FILE" else n))
        self._regs.append(self.agent.register_memory(descs, self.remote_type))
        return devs

    def xfer(self, op: str, pieces: list[tuple[int, int]], objs: list[tuple[int, int]]):
        """A prepared transfer: pieces are (address, length) in DRAM, objs
        (offset, devId) of the objects, pairwise."""
        local = self.agent.get_xfer_descs([(a, n, 0) for a, n in pieces], "DRAM")
        remote = self.agent.get_xfer_descs([(off, n, dev) for (off, dev), (_, n) in zip(objs, pieces)],
                                           self.remote_type)
        return self.agent.initialize_xfer(op, local, remote, self.name)

    def run(self, handle) -> str:
        """Posts a prepared transfer and waits for its end: "DONE", or the
        exception of NIXL's status (nixlBackendError, ...)."""
        state = self.agent.transfer(handle)
        return state if state != "PROC" else wait(self.agent, handle)

    def query(self, keys: list[str]) -> list:
        return self.agent.query_memory([(0, 0, 0, k) for k in keys], self.backend, "OBJ")

    def close(self) -> None:
        """Deregisters everything and drops the agent, which destroys its
        backend (MOONCAKE_STORE unmounts from the master: close before the
        master stops)."""
        if self.agent is None:
            return
        for r in reversed(self._regs):
            self.agent.deregister_memory(r)
        self._regs.clear()
        self.agent = None
        gc.collect()
