"""SGLang's own test of its Mooncake HiCache backend, shipped in the wheel
(sglang/srt/mem_cache/storage/mooncake_store/test_mooncake_store.py), run
unchanged as a module against ``mooncake up``, with the environment its
README gives. Its __main__ runs five checks (one single set/get, four
batch_set_v1/batch_get_v1 round trips: MHA and MLA, TP ranks 0/1, 1 of 4
and 3 of 8), compares the data read back, and raises on the first failure."""

from __future__ import annotations

import re

from mccluster import refused_addr
from sgl_harness import run_python, sglang_env

MODULE = "sglang.srt.mem_cache.storage.mooncake_store.test_mooncake_store"


def run_shipped(master: str):
    return run_python(["-m", MODULE], sglang_env(master))


def passed_checks(out: str) -> tuple[int, int, bool]:
    """(single passes, batch passes, all passed) as the module logs them."""
    return (len(re.findall(r"Single operation passed", out)), len(re.findall(r"Batch operation passed", out)),
            "All tests passed" in out)


def test_shipped_module_passes(cluster):
    p = run_shipped(cluster.master)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"SGLang's test_mooncake_store failed (exit {p.returncode}):\n{out[-6000:]}"
    # Exit 0 alone could mean the checks never ran (e.g. a module that
    # changed its __main__); count them.
    assert passed_checks(out) == (1, 4, True), out[-6000:]


def test_shipped_module_fails_without_a_store():
    """Negative control: with nothing at MOONCAKE_MASTER the module must fail,
    and its failure must reach us as a nonzero exit without the pass lines."""
    with refused_addr() as nowhere:
        p = run_shipped(nowhere)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-4000:]
    assert passed_checks(out) == (0, 0, False), out[-4000:]
