"""Helpers of the SGLang suite (see conftest.py): the environment SGLang's
Mooncake modules read, a bare master, and a runner for scripts in the
suite's venv."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from mccluster import free_port  # python/tests, on sys.path through e2e/conftest.py

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


def wait_http(url: str, timeout: float = 30) -> None:
    """Waits until url answers (any status): the server is listening."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class BareMaster:
    """``mooncake master`` alone: a store with no segment until a client
    mounts one."""

    def __init__(self, mooncake_bin: Path):
        self.rpc_port, self.metrics_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.rpc_port}"
        self.proc = subprocess.Popen(
            [str(mooncake_bin), "master", "--rpc_address", "127.0.0.1", "--rpc_port", str(self.rpc_port),
             "--metrics_host", "127.0.0.1", "--metrics_port", str(self.metrics_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_http(f"http://127.0.0.1:{self.metrics_port}/health")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def run_python(args: list, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs the suite's venv python (this interpreter) with args; output captured."""
    return subprocess.run([sys.executable, *args], env=env, cwd=HERE, capture_output=True, text=True,
                          timeout=timeout)
