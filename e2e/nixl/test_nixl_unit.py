"""NIXL's own unit test of its Mooncake backend (test/unit/plugins/mooncake/
mooncake_backend_test.cpp, built unchanged by build.sh), run on our
libtransfer_engine.so.

The test drives nixlMooncakeEngine directly: one agent transferring to
itself, then two agents in one process (READ and WRITE, with and without
notifications, fresh and reused request handles, 64 MiB each), checking every
byte with assert(). It exits non-zero (SIGABRT) at the first failed check."""

from __future__ import annotations

import subprocess

UNIT_TIMEOUT = 300  # the whole program takes about 35 s here


def test_mooncake_backend_test(nixl_build, nixl_env, tmp_path):
    log = tmp_path / "mooncake_backend_test.log"
    with open(log, "w") as out:
        r = subprocess.run([str(nixl_build / "mooncake_backend_test")], env=nixl_env,
                           stdout=out, stderr=subprocess.STDOUT, timeout=UNIT_TIMEOUT)
    text = log.read_text(errors="replace")
    assert r.returncode == 0, f"mooncake_backend_test exited {r.returncode}:\n{text[-4000:]}"
    # It ran the transfers and checked them (a build that lost its test body
    # would also exit 0).
    assert text.count("Data verification: OK") >= 200, text[-4000:]
    assert "Inter-agent memory transfer test" in text


def test_unit_test_keeps_its_asserts(nixl_build):
    """The unit test checks with assert(): built with NDEBUG it could not
    fail. Its binary must still call glibc's assertion handler."""
    syms = subprocess.run(["nm", "-D", "--undefined-only", str(nixl_build / "mooncake_backend_test")],
                          capture_output=True, text=True, check=True).stdout
    assert "__assert_fail" in syms
