"""The official Mooncake wheel's console scripts, over mooncake-go's one
command (``mooncake``, bundled in the package as mooncake_go/bin/mooncake):

  mooncake_master                ->  mooncake master ...
  mooncake_client                ->  mooncake client ...
  transfer_engine_bench          ->  mooncake bench te ...
  mooncake_http_metadata_server  ->  mooncake metadata --host H --port P

Each replaces this process with the command (the PID a launcher holds is
the server's, as with the official scripts), with the arguments passed on
as they are, but for gflags' single-dash spelling of long flags
(``-rpc_port=50051``), which is rewritten to the double dash. The commands
themselves take the official flag names; docs/operator-flags.md maps every
official flag and environment variable to ours.

MOONCAKE_BIN names another mooncake binary to run instead of the bundled
one (a development build, say).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import stat
import sys
from typing import List, Optional, Sequence

# A gflags long flag written with one dash: -name or -name=value, where
# name is more than one letter (-v alone is glog's --v, rewritten too).
_SINGLE_DASH = re.compile(r"^-([A-Za-z][A-Za-z0-9_]*)(=.*)?$")


def binary() -> str:
    """The mooncake command to run: MOONCAKE_BIN, else the bundled one."""
    env = os.environ.get("MOONCAKE_BIN")
    if env:
        return env
    spec = importlib.util.find_spec("mooncake_go")
    dirs = list(spec.submodule_search_locations or []) if spec else []
    for d in dirs:
        path = os.path.join(d, "bin", "mooncake")
        if os.path.isfile(path):
            return path
    raise SystemExit(
        "mooncake-go: the mooncake command is not in this installation "
        f"(looked in {', '.join(os.path.join(d, 'bin') for d in dirs) or 'no mooncake_go package'}); "
        "reinstall the package or set MOONCAKE_BIN"
    )


def gflags_args(args: Sequence[str]) -> List[str]:
    """args with gflags' single-dash long flags given two dashes; the
    rest, and everything after "--", unchanged."""
    out: List[str] = []
    for i, a in enumerate(args):
        if a == "--":
            return out + list(args[i:])
        m = _SINGLE_DASH.match(a)
        out.append("-" + a if m and (len(m.group(1)) > 1 or m.group(1) == "v") else a)
    return out


def _exec(sub: List[str], args: Sequence[str]) -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        # A wheel unpacked without modes; the official scripts do the same.
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.execv(path, [path] + sub + list(args))


def master(argv: Optional[Sequence[str]] = None) -> None:
    """mooncake_master: the store's master (official flags; see
    ``mooncake master --help``)."""
    _exec(["master"], gflags_args(sys.argv[1:] if argv is None else argv))


def client(argv: Optional[Sequence[str]] = None) -> None:
    """mooncake_client: a store client process that owns its segment and
    serves other processes (official flags; see ``mooncake client --help``)."""
    _exec(["client"], gflags_args(sys.argv[1:] if argv is None else argv))


def transfer_engine_bench(argv: Optional[Sequence[str]] = None) -> None:
    """transfer_engine_bench: the Transfer Engine benchmark (official
    flags; see ``mooncake bench te --help``)."""
    _exec(["bench", "te"], gflags_args(sys.argv[1:] if argv is None else argv))


# Python's logging levels (the official server's --log-level) as ours.
_LOG_LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error", "CRITICAL": "error"}


def http_metadata_server(argv: Optional[Sequence[str]] = None) -> None:
    """mooncake_http_metadata_server: the Transfer Engines' HTTP metadata
    server, with the official flags and defaults (0.0.0.0:8080)."""
    p = argparse.ArgumentParser(prog="mooncake_http_metadata_server",
                                description="HTTP metadata server of mooncake-go (mooncake metadata)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--port", type=int, default=8080, help="Port to listen on")
    p.add_argument("--host", type=str, default="0.0.0.0", help="Host to bind to")
    p.add_argument("--log-level", type=str, choices=sorted(_LOG_LEVELS), default="INFO", help="Logging level")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    _exec(["--log-level", _LOG_LEVELS[a.log_level], "metadata"], ["--host", a.host, "--port", str(a.port)])


if __name__ == "__main__":  # python -m mooncake.cli master|client|bench|metadata ...
    cmds = {"master": master, "client": client, "bench": transfer_engine_bench, "metadata": http_metadata_server}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        raise SystemExit(f"usage: python -m mooncake.cli {{{','.join(cmds)}}} [flags]")
    cmds[sys.argv[1]](sys.argv[2:])
