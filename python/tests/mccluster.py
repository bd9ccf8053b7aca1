"""A store cluster for tests: ``mooncake up`` in a child process, ready when
it prints "ready". Shared by the package's suite (python/tests) and the
framework suites (e2e/), which put this directory on sys.path."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A running ``mooncake up``: its master address and process."""

    def __init__(self, proc: subprocess.Popen, master: str, lines: list):
        self.proc = proc
        self.master = master
        self.lines = lines

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_cluster(mooncake_bin: Path, *args: str, timeout: float = 60) -> Cluster:
    """Starts ``mooncake up`` and waits for its "ready" line."""
    cmd = [str(mooncake_bin), "up", "--rpc_port", "0", "--metrics_port", "-1",
           "--etcd", "127.0.0.1:0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list = []
    master = None
    ready = threading.Event()

    def read():
        nonlocal master
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("clients") and "--master" in line:
                master = line.split("--master", 1)[1].strip()
            if line.strip() == "ready":
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout) or master is None or proc.poll() is not None:
        c = Cluster(proc, "", lines)
        c.stop()
        raise RuntimeError("mooncake up did not become ready:\n" + "\n".join(lines[-30:]))
    return Cluster(proc, master, lines)
