"""fork() and the library: a Go runtime does not survive fork(), so the
library starts its runtime at the first call that needs Go, not when it is
loaded. A process may load the package (and call what needs no Go) and fork
workers that use it; after a fork that follows real use, the child gets an
error that says why instead of hanging.

Each case runs in a fresh interpreter (this one has used the library), and
each forked child runs under alarm() with the default action, which kills
it even while it is blocked in a foreign call: a hang fails the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = """
import os, signal, sys, traceback

def forked(body):
    '''Runs body in a forked child under an alarm; says how it ended.'''
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(60)
        try:
            body()
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
        return "hung"
    return "ok" if status == 0 else f"failed({status})"
"""


def run(script: str) -> str:
    r = subprocess.run([sys.executable, "-c", CHILD + textwrap.dedent(script)], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-4000:]}"
    return r.stdout


def test_fork_after_load_before_use():
    """The library is loaded and called (abi_version needs no Go), then the
    process forks; child and parent both move bytes between two engines."""
    out = run("""
        import mooncake.engine, mooncake_go
        assert mooncake_go.abi_version >> 16 == 1
        assert mooncake_go._lib.lib.loaded

        def transfer():
            a, b = mooncake.engine.TransferEngine(), mooncake.engine.TransferEngine()
            assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            n = 1 << 16
            payload = bytes(i * 7 % 251 for i in range(n))
            src, dst = a.allocate_managed_buffer(n), b.allocate_managed_buffer(n)
            assert a.write_bytes_to_buffer(src, payload, n) == 0
            assert a.transfer_sync_write(f"127.0.0.1:{b.get_rpc_port()}", src, dst, n) == 0
            assert b.read_bytes_from_buffer(dst, n) == payload
            a.close()
            b.close()

        status = forked(transfer)
        transfer()
        print("child", status)
    """)
    assert out.split() == ["child", "ok"], out


def test_fork_after_use_fails_fast():
    """After a fork that follows use, the child's calls raise an error that
    names the fork; the parent is untouched."""
    out = run("""
        import mooncake_go
        from mooncake_go import errors

        te = mooncake_go.TransferEngine(host="127.0.0.1", transport="tcp")

        def child():
            for call in (lambda: mooncake_go.TransferEngine(host="127.0.0.1"), lambda: te.ports):
                try:
                    call()
                except errors.MooncakeError as e:
                    assert "forked" in str(e), e
                else:
                    raise AssertionError("a call after the fork succeeded")

        status = forked(child)
        assert te.name.startswith("127.0.0.1:")
        te.close()
        print("child", status)
    """)
    assert out.split() == ["child", "ok"], out
