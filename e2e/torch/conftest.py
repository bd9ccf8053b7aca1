"""The torch suite: Mooncake PG (mooncake.pg, backend ``mooncake-cpu``)
driven by real torch.distributed in several local processes, checked
against gloo on the same inputs.

Each test starts its ranks as separate Python processes (this venv, our
wheel) running a worker script of this directory; ``ranks`` gathers their
output and exit codes and kills (by pid) whatever is left at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mccluster import free_port  # noqa: F401 (for the tests; python/tests is on sys.path: e2e/conftest.py)

HERE = Path(__file__).resolve().parent


class Ranks:
    """Worker processes of one test."""

    def __init__(self, tmp: Path):
        import torch.distributed as dist

        self.tmp = tmp
        self.procs: dict = {}
        # The ranks' TCPStore lives here, on a port the OS picked, so it
        # outlives any rank (as torchrun's agent does) and no other test on
        # the machine can take its port between choosing and binding it.
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.port = self.store.port

    def env(self, extra=None) -> dict:
        env = dict(os.environ)
        env.setdefault("MOONCAKE_PG_TIMEOUT", "10")
        env["PYTHONWARNINGS"] = "ignore"
        env.update(extra or {})
        return env

    def start(self, name: str, argv, env=None) -> subprocess.Popen:
        out = open(self.tmp / f"{name}.log", "w")
        # Its own session: stop() kills what it started too (torchrun's ranks).
        p = subprocess.Popen([sys.executable, *map(str, argv)], stdout=out, stderr=subprocess.STDOUT,
                             env=self.env(env), cwd=HERE, start_new_session=True)
        self.procs[name] = p
        return p

    def spawn(self, script: str, case: str, world: int, *args, env=None) -> None:
        for r in range(world):
            self.start(f"r{r}", [HERE / script, case, r, world, self.port, *args], env)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def events(self, name: str) -> list:
        out = []
        for line in self.log(name).splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def wait(self, timeout: float, names=None) -> dict:
        """Exit codes of the named processes (all by default); fails the
        test with their logs if one is still running after timeout."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name in names or list(self.procs):
            p = self.procs[name]
            try:
                codes[name] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logs = "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.procs)
                pytest.fail(f"{name} still running after {timeout} s (hang)\n{logs}")
        return codes

    def check(self, timeout: float) -> None:
        codes = self.wait(timeout)
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            logs = "\n".join(f"--- {n} (exit {codes[n]})\n{self.log(n)[-4000:]}" for n in self.procs)
            pytest.fail(f"ranks failed: {bad}\n{logs}")

    def stop(self) -> None:
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group outlives a leader that exited
            except ProcessLookupError:
                pass
            p.wait()


@pytest.fixture
def ranks(tmp_path):
    r = Ranks(tmp_path)
    yield r
    r.stop()
