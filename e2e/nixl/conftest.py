"""NIXL suite fixtures: NIXL's Mooncake plugin and unit test built from NIXL's
source against our library (build.sh), the transports to run on, and NIXL
agents in processes of their own (peer.py) that the tests drive."""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REPLY_TIMEOUT = 120  # one peer command; a transfer's own deadline is shorter


@pytest.fixture(scope="session")
def nixl_build() -> Path:
    """build/e2e-nixl (or $NIXL_BUILD_DIR): plugins/libplugin_MOONCAKE.so and
    mooncake_backend_test, built for this venv's nixl-cu12 wheel."""
    env = dict(os.environ)
    env.setdefault("MOONCAKE_LIB_DIR", str(ROOT / "build"))
    r = subprocess.run(["bash", str(HERE / "build.sh"), sys.executable], env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"e2e/nixl/build.sh failed ({r.returncode}):\n{r.stderr}")
    return Path(r.stdout.strip().splitlines()[-1])


# The two ways our library moves bytes between processes on one host: the
# default (the same-host shared-memory path) and Mooncake's MC_FORCE_TCP=1.
TRANSPORTS = {"default": {}, "tcp": {"MC_FORCE_TCP": "1"}}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request) -> str:
    return request.param


@pytest.fixture
def nixl_env(nixl_build, transport) -> dict:
    """The environment of every NIXL process: only our plugin directory (no
    UCX plugin, which needs libcuda) and the transport under test."""
    env = {k: v for k, v in os.environ.items() if k != "MC_FORCE_TCP"}
    env["NIXL_PLUGIN_DIR"] = str(nixl_build / "plugins")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(TRANSPORTS[transport])
    return env



class PeerProc:
    """A peer.py process: call(cmd, **args) sends one command and returns its
    reply; a reply with ok=false fails the test with the peer's traceback."""

    def __init__(self, name: str, env: dict, log: Path):
        self.name = name
        self.log = log
        self._stderr = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "peer.py"), name], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1)
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self._reply()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # EOF: the peer is gone

    def _reply(self) -> dict:
        try:
            line = self._lines.get(timeout=REPLY_TIMEOUT)
        except queue.Empty:
            pytest.fail(f"peer {self.name}: no reply in {REPLY_TIMEOUT} s\n{self.stderr()}")
        if line is None:
            pytest.fail(f"peer {self.name} exited ({self.proc.wait()})\n{self.stderr()}")
        rep = json.loads(line)
        if not rep.pop("ok"):
            pytest.fail(f"peer {self.name}: {rep['error']}\n{self.stderr()}")
        return rep

    def call(self, cmd: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def dump(self, buf: str) -> bytes:
        return base64.b64decode(self.call("dump", name=buf)["data"])

    def notifs(self, count: int, timeout: float = 30) -> dict[str, list[bytes]]:
        got = self.call("notifs", count=count, timeout=timeout)["notifs"]
        return {a: [base64.b64decode(m) for m in ms] for a, ms in got.items()}

    def stderr(self) -> str:
        self._stderr.flush()
        return f"--- {self.name} stderr ---\n" + self.log.read_text()[-4000:]

    def close(self) -> int:
        """Asks the peer to exit and returns its exit status."""
        if self.proc.poll() is None:
            try:
                self.call("exit")
            except BaseException:
                pass
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.proc.returncode


@pytest.fixture
def peers(nixl_env, tmp_path):
    """peers(name, ...) starts NIXL agents, one process each; all are closed
    after the test, and each must exit cleanly."""
    started: list[PeerProc] = []

    def start(*names: str) -> list[PeerProc]:
        for n in names:
            started.append(PeerProc(n, nixl_env, tmp_path / f"{n}.stderr"))
        return started[-len(names):]

    yield start
    bad = {p.name: p.close() for p in started}
    bad = {n: rc for n, rc in bad.items() if rc != 0}
    assert not bad, f"peers exited with {bad}"
