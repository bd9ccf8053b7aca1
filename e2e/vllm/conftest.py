"""vLLM suite fixtures: the two weight variants of the tiny model and a
directory for the servers' logs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tinymodel  # noqa: E402


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict:
    """{"a": dir, "b": dir}: one architecture, two seeds. Both directories are
    named "tiny" (vLLM's store keys carry the model directory's basename, so
    the variants share keys: the negative control of the store test needs it)."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, seed in (("a", 1), ("b", 2)):
        out[name] = tinymodel.write(root / name / "tiny", seed)
    return out


@pytest.fixture(scope="session")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")
