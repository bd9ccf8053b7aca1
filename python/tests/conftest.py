"""Fixtures: a store cluster (``bin/mooncake up`` in a child process), the
repository paths, and helpers shared by the suites."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mccluster import start_cluster

ROOT = Path(__file__).resolve().parents[2]  # the repository
BIN = Path(os.environ.get("MOONCAKE_BIN", ROOT / "bin" / "mooncake"))

# Small pools: the machines running the suite are small.
SEGMENT = 64 << 20
LOCAL_BUFFER = 32 << 20


@pytest.fixture(scope="session")
def mooncake_bin() -> Path:
    """bin/mooncake, built from the repository if it is missing."""
    if not BIN.exists():
        go = shutil.which("go")
        if go is None:
            pytest.skip(f"{BIN} is missing and there is no Go toolchain to build it")
        subprocess.check_call([go, "build", "-o", str(BIN), "./cmd/mooncake"], cwd=ROOT)
    return BIN


@pytest.fixture(scope="session")
def cluster(mooncake_bin):
    """One master (no HA) and one storage node of 256 MiB, for the session."""
    c = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "256MiB")
    yield c
    c.stop()


@pytest.fixture
def master(cluster) -> str:
    return cluster.master


@pytest.fixture
def official_python() -> str:
    """An interpreter with the official mooncake wheel (``make deps``
    creates .venv-official), or a skip that says what is missing."""
    py = os.environ.get("MOONCAKE_OFFICIAL_PYTHON", str(ROOT / ".venv-official" / "bin" / "python"))
    if not Path(py).exists():
        pytest.skip(f"official Mooncake not installed: {py} is missing (run `make deps`)")
    r = subprocess.run([py, "-c", "import mooncake.engine"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"official Mooncake unusable with {py}: {last}")
    return py


@pytest.fixture(autouse=True)
def no_handle_leaks(request):
    """Every test closes what it opened (engines and stores of the C ABI)."""
    import mooncake_go

    before = mooncake_go.live_handles()
    yield
    if "leaks_ok" in request.keywords:
        return
    import gc

    deadline = time.monotonic() + 5
    while True:
        gc.collect()
        after = mooncake_go.live_handles()
        if after[0] <= before[0] and after[1] <= before[1]:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"leaked handles: (engines, stores) {before} -> {after}")
        time.sleep(0.05)


def numpy_or_skip():
    return pytest.importorskip("numpy")


def torch_or_none():
    try:
        import torch  # noqa: F401

        return torch
    except Exception:  # not installed, or a CUDA build without its libraries
        return None


PY = sys.executable
