"""Fixtures shared by the framework suites: this repository's paths, a store
cluster (``mooncake up``) and the C library. Each suite runs in the
framework's own venv with our wheel installed (e2e/run.sh)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))

from mccluster import start_cluster  # noqa: E402

BIN = Path(os.environ.get("MOONCAKE_BIN", ROOT / "bin" / "mooncake"))
LIB_DIR = Path(os.environ.get("MOONCAKE_LIB_DIR", ROOT / "build"))


@pytest.fixture(scope="session")
def mooncake_bin() -> Path:
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: run the suites through e2e/run.sh")
    return BIN


@pytest.fixture(scope="module")
def cluster(mooncake_bin):
    """A master (no HA) with its admin port (.metrics_port) and one storage
    node, per module."""
    c = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "512MiB", admin=True)
    yield c
    c.stop()
