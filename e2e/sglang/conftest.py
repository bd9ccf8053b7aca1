"""Fixtures of the SGLang suite.

SGLang 0.5.23 cannot serve on a CPU-only host (its kernels are CUDA), but its
HiCache storage backend (MooncakeStore), its host KV pools and its PD transfer
wrapper (MooncakeTransferEngine) run on CPU; the suite drives those, unchanged,
against a real ``mooncake up`` (fixture ``cluster`` of e2e/conftest.py).
"""

from __future__ import annotations

import pytest

from mccluster import start_real_client
from sgl_harness import BareMaster, sglang_env


@pytest.fixture
def sglang_environ(cluster, monkeypatch):
    """sglang_env applied to this process, for the in-process tests."""
    for k, v in sglang_env(cluster.master).items():
        monkeypatch.setenv(k, v)
    return cluster


@pytest.fixture
def bare_master(mooncake_bin):
    """A master with no storage node: no segment until a client mounts one."""
    m = BareMaster(mooncake_bin)
    yield m
    m.stop()


@pytest.fixture
def real_client(cluster, mooncake_bin):
    """A real client (``mooncake client``, the official mooncake_client) of
    the cluster, for standalone storage: its dummies share its pool."""
    rc = start_real_client(mooncake_bin, cluster.master, segment="128MiB")
    yield rc
    rc.stop()
