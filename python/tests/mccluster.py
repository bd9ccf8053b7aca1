"""Processes and addresses for tests: ``mooncake up`` in a child process
(ready when it prints "ready"), stopping children, and loopback addresses.
Shared by the package's suite (python/tests) and the framework suites
(e2e/), which put this directory on sys.path."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
from pathlib import Path


def free_port() -> int:
    """A port free now on every interface. Only for a server that must be
    told its port in advance: prefer port 0 and the address the server
    reports. It lies outside the kernel's ephemeral range, so no bind to
    port 0 and no outgoing connection is given it before the server binds
    it (a port freed from a bind to port 0 is handed out again soon)."""
    low, high = 32768, 60999  # Linux's defaults
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        pass
    ports = [p for p in range(10000, 65536) if not low <= p <= high] or list(range(10000, 65536))
    start = random.randrange(len(ports))
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range")


@contextlib.contextmanager
def refused_addr():
    """A loopback host:port that refuses connections while the block runs: a
    socket bound there that never listens, so nothing else can take it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        host, port = s.getsockname()
        yield f"{host}:{port}"


def stop_process(proc: subprocess.Popen, grace: float = 20, group: bool = False) -> None:
    """SIGTERM to proc, SIGKILL after grace seconds, and reap. With
    group=True (children started with start_new_session) the signals go to
    its process group, and what is left of the group is killed even when
    proc itself has exited."""

    def send(sig: int) -> None:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)  # a no-op once proc is reaped
        except ProcessLookupError:
            pass

    if proc.poll() is None:
        send(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    if group or proc.poll() is None:
        send(signal.SIGKILL)
    proc.wait()


def field(line: str, name: str) -> str | None:
    """The value of name=value in a line of `mooncake` output."""
    for word in line.split():
        if word.startswith(name + "="):
            return word[len(name) + 1:]
    return None


class Cluster:
    """A running ``mooncake up``: its master address, the master's admin
    (metrics) address when it serves one, and the process."""

    def __init__(self, proc: subprocess.Popen, master: str, lines: list, admin: str | None = None):
        self.proc = proc
        self.master = master
        self.lines = lines
        self.admin = admin

    @property
    def metrics_port(self) -> int:
        if self.admin is None:
            raise RuntimeError("this cluster serves no admin port (start_cluster(admin=True))")
        return int(self.admin.rsplit(":", 1)[1])

    def stop(self) -> None:
        stop_process(self.proc)


def start_cluster(mooncake_bin: Path, *args: str, admin: bool = False, timeout: float = 60) -> Cluster:
    """Starts ``mooncake up`` and waits for its "ready" line. Every port is
    picked by the system and read back from the output; admin=True also
    starts the master's admin server (/metrics, /get_all_segments, ...)."""
    cmd = [str(mooncake_bin), "up", "--rpc_port", "0", "--metrics_port", "0" if admin else "-1",
           "--etcd", "127.0.0.1:0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list = []
    master = admin_addr = None
    ready = threading.Event()

    def read():
        nonlocal master, admin_addr
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("clients") and "--master" in line:
                # "clients --master URL [--auth_token_file F ...]" (--secure)
                master = line.split("--master", 1)[1].split()[0]
            if line.startswith("master") and admin_addr is None:
                admin_addr = field(line, "admin")
            if line.strip() == "ready":
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if (not ready.wait(timeout) or master is None or proc.poll() is not None
            or (admin and admin_addr is None)):
        stop_process(proc)
        raise RuntimeError("mooncake up did not become ready:\n" + "\n".join(lines[-30:]))
    return Cluster(proc, master, lines, admin_addr)


class RealClient:
    """A ``mooncake client`` child process (the official mooncake_client):
    dummy clients reach it at ``address`` ("127.0.0.1:<port>")."""

    def __init__(self, proc: subprocess.Popen, address: str, lines: list):
        self.proc, self.address, self.lines = proc, address, lines

    def stop(self) -> None:
        stop_process(self.proc)


def start_real_client(mooncake_bin: Path, master: str, *args: str, segment: str = "256MiB",
                      timeout: float = 60) -> RealClient:
    """Starts ``mooncake client`` with the official flags, contributing
    ``segment`` bytes to the pool of ``master``, on a port of its own, and
    waits for its ready line."""
    port = free_port()  # names its unix socket; no TCP port is bound
    cmd = [str(mooncake_bin), "client", "--master_server_address", master, "--metadata_server", "P2PHANDSHAKE",
           "--global_segment_size", segment, "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list = []
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("node ready"):
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout) or proc.poll() is not None:
        stop_process(proc)
        raise RuntimeError("mooncake client did not become ready:\n" + "\n".join(lines[-30:]))
    return RealClient(proc, f"127.0.0.1:{port}", lines)
