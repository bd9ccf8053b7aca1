"""Helpers of the SGLang suite (see conftest.py): the environment SGLang's
Mooncake modules read, a bare master, and a runner for scripts in the
suite's venv."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from mccluster import field, stop_process  # python/tests, on sys.path through e2e/conftest.py

HERE = Path(__file__).resolve().parent


def sglang_env(master: str, **extra: str) -> dict:
    """The process environment SGLang's Mooncake modules read (sglang.srt.environ
    reads os.environ at each get): the master, the TCP protocol (the default
    is "rdma") and this host's name for the transfer engine."""
    env = dict(os.environ)
    env.update(MOONCAKE_MASTER=master, MOONCAKE_PROTOCOL="tcp", MOONCAKE_LOCAL_HOSTNAME="127.0.0.1",
               MOONCAKE_GLOBAL_SEGMENT_SIZE=str(256 << 20))
    env.update(extra)
    return env


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Waits until url answers 200, failing at once if proc (the server)
    exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:  # not listening yet, or an HTTP error status
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:2]} exited with {proc.returncode} before {url} answered")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 in {timeout} s")
        time.sleep(0.1)


class BareMaster:
    """``mooncake master`` alone: a store with no segment until a client
    mounts one. Its ports are picked by the system and read back from its
    "master listening rpc=... admin=..." line."""

    def __init__(self, mooncake_bin: Path):
        self.proc = subprocess.Popen(
            [str(mooncake_bin), "master", "--rpc_address", "127.0.0.1", "--rpc_port", "0",
             "--metrics_host", "127.0.0.1", "--metrics_port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            line = self._listening_line()
            self.address = field(line, "rpc")
            self.metrics_port = int(field(line, "admin").rsplit(":", 1)[1])
            wait_http(f"http://127.0.0.1:{self.metrics_port}/health", self.proc)
        except BaseException:
            self.stop()
            raise
        # Keep reading, so a master that logs a lot never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def _listening_line(self, timeout: float = 30) -> str:
        lines: queue.Queue = queue.Queue()

        def read():
            for line in self.proc.stdout:
                lines.put(line)
                if line.startswith("master listening"):
                    return
            lines.put("")  # EOF: the master exited

        threading.Thread(target=read, daemon=True).start()
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line.startswith("master listening"):
                return line
            if not line:
                raise RuntimeError("mooncake master exited before listening:\n" + "".join(seen[-30:]))
            seen.append(line)

    def stop(self) -> None:
        stop_process(self.proc, group=True)


def run_python(args: list, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs the suite's venv python (this interpreter) with args; output captured."""
    return subprocess.run([sys.executable, *args], env=env, cwd=HERE, capture_output=True, text=True,
                          timeout=timeout)
