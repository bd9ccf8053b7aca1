"""The compat modules (mooncake.store with its mixins, mooncake.engine)
stand on mooncake_go's public API only: no private module, function or
method of mooncake_go, no raw library calls. Checked in the source
(imports and attribute chains) and, for the store, while the compat
methods run (no private attribute of a mooncake_go.Store is touched from
outside mooncake_go)."""

from __future__ import annotations

import ast
import sys
import uuid
from pathlib import Path

import pytest

import mooncake.store as compat
import mooncake_go
from conftest import LOCAL_BUFFER, SEGMENT, numpy_or_skip

# The compat modules: the store's class and its mixins, the engine.
COMPAT_FILES = ["store.py", "_store_ext.py", "_tensor_ext.py", "engine.py"]


def private_uses(path: Path) -> list:
    """(line, what) of each use of mooncake_go's private names in path:
    imports of a private module or name, and mooncake_go._x attributes."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mooncake_go"):
            if any(p.startswith("_") for p in node.module.split(".")):
                out.append((node.lineno, f"from {node.module} import"))
            out += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names
                    if a.name.startswith("mooncake_go") and any(p.startswith("_") for p in a.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            chain = node.value
            while isinstance(chain, ast.Attribute):
                chain = chain.value
            if isinstance(chain, ast.Name) and chain.id == "mooncake_go":
                out.append((node.lineno, f"mooncake_go...{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in ("lib", "_lib"):
            out.append((node.lineno, node.id))
    return out


@pytest.mark.parametrize("name", COMPAT_FILES)
def test_source_uses_no_private_names(name):
    path = Path(compat.__file__).parent / name
    assert private_uses(path) == [], f"{name} uses mooncake_go's private names"


@pytest.fixture
def private_reads(monkeypatch):
    """The private attributes of mooncake_go.Store objects read from
    outside mooncake_go, as (module, name), while the test runs."""
    seen = []

    def spy(self, name):
        if name.startswith("_") and not name.startswith("__"):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller != "mooncake_go" and not caller.startswith("mooncake_go."):
                seen.append((caller, name))
        return object.__getattribute__(self, name)

    monkeypatch.setattr(mooncake_go.Store, "__getattribute__", spy)
    return seen


def test_compat_calls_use_public_methods(master, private_reads):
    """Every kind of compat call (values, buffers, parts, ranges, sessions,
    tensors, existence, removal) goes through public methods."""
    np = numpy_or_skip()
    s = compat.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", master) == 0
    try:
        buf = np.arange(1 << 16, dtype=np.uint8)
        p = int(buf.ctypes.data)
        assert s.register_buffer(p, buf.nbytes) == 0
        k = [uuid.uuid4().hex for _ in range(8)]
        assert s.put(k[0], b"v") == 0 and s.get(k[0]) == b"v"
        assert s.put_batch([k[1]], [b"w"]) == 0 and s.upsert_batch([k[1]], [b"x"]) == 0
        assert s.upsert_from(k[1], p, 3) == 0
        assert s.batch_put_from([k[2]], [p], [16]) == [0]
        assert s.batch_upsert_from([k[2]], [p], [8]) == [0]
        assert s.batch_get_into([k[2]], [p + 1000], [100]) == [8]
        assert s.batch_put_from_multi_buffers([k[3]], [[p, p + 10]], [[4, 4]]) == [0]
        assert s.batch_get_into_multi_buffers([k[3]], [[p + 2000, p + 3000]], [[4, 4]]) == [8]
        assert s.batch_is_exist([k[3], uuid.uuid4().hex]) == [1, 0]
        assert s.batch_get_session_start([k[3]]) == [0]
        assert s.batch_get_into_multi_buffer_ranges([k[3]], [[p + 4000]], [[2]], [[1]]) == [2]
        assert s.batch_get_session_end([k[3]]) == 0
        assert s.get_into_ranges([p + 5000], [[k[3]]], [[[0]]], [[[0]]], [[[3]]]) == [[[3]]]
        assert s.batch_put_session_start([k[4]], [4]) == [0]
        assert s.batch_put_from_multi_buffer_ranges([k[4]], [[p]], [[4]], [[0]]) == [4]
        assert s.batch_put_session_end([k[4]]) == [0]
        assert s.batch_put_session_start([k[5]], [4]) == [0]
        assert s.batch_put_session_revoke([k[5]]) == [0]
        assert s.put_tensor(k[6], np.ones((4, 4), dtype=np.float32)) == 0  # a put session per tensor
        assert s.get_tensor(k[6]) is not None
        assert s.batch_remove([k[0], k[1]], True) == [0, 0]
        assert s.unregister_buffer(p) == 0
    finally:
        s.close()
    assert private_reads == []
