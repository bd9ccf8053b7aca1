"""The suite's own hygiene: how its tests get ports."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent


def port_grabs(path: Path) -> list:
    """Lines of path that call free_port(): a port bound, closed and handed
    on, which anything may take before the server binds it."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == "free_port":
                out.append(node.lineno)
    return out


def test_servers_pick_their_own_ports():
    """No test of this suite picks a port by binding and closing a socket:
    servers bind port 0 and report the port they got (mooncake up,
    mooncake metadata), engines publish theirs. mccluster.free_port stays
    for the framework suites' servers that must be told a port."""
    grabs = {p.name: port_grabs(p) for p in sorted(HERE.glob("*.py")) if p.name != "mccluster.py"}
    assert {n: lines for n, lines in grabs.items() if lines} == {}
