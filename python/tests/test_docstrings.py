"""The defaults mooncake_go's docstrings state are the C ABI's: each is
checked against the comment of its field in include/mooncake.h, the
library's contract, so that neither side drifts alone."""

from __future__ import annotations

import re

import pytest

import mooncake_go as mg
from conftest import ROOT

HEADER = ROOT / "include" / "mooncake.h"

# (class, parameter, its field in the header, the default both state)
CASES = [
    (mg.TransferEngine, "lanes", "lanes", "4"),
    (mg.TransferEngine, "slice_size", "slice_size", "128 KiB"),
    (mg.TransferEngine, "max_retries", "max_retries", "3"),
    (mg.TransferEngine, "rpc_port", "rpc_port", "a free port"),
    (mg.TransferEngine, "data_port", "data_port", "a free port"),
    (mg.Store, "segment_size", "segment_size", "512 MiB"),
    (mg.Store, "local_buffer_size", "local_buffer_size", "128 MiB"),
    (mg.Store, "rpc_timeout_ms", "rpc_timeout_ms", "30 s"),
    (mg.Store, "replicas", "replicas", "1"),
]


def doc_default(doc: str, param: str) -> str:
    """The bracketed default that follows param in a docstring
    (":param p: ... [x]" or "``p``: ... [x]")."""
    m = re.search(rf"(:param {param}:|``{param}``:)[^\[]*\[([^\]]*)\]", doc)
    assert m, f"no default documented for {param}"
    return " ".join(m.group(2).split())


def header_comment(field: str, struct: str) -> str:
    """The comment of field in the header's struct: on its line, else the
    block just above it."""
    text = HEADER.read_text()
    body = text[text.index(f"typedef struct {struct} {{"):]
    body = body[:body.index("}")]
    lines = body.splitlines()
    i = next(i for i, ln in enumerate(lines) if re.search(rf"\b{field};", ln))
    if "/*" in lines[i]:
        comment = lines[i][lines[i].index("/*"):]
    else:
        j = i - 1
        while "/*" not in lines[j]:
            j -= 1
        comment = " ".join(lines[j:i])
    return " ".join(comment.replace("/*", " ").replace("*/", " ").replace("*", " ").split())


@pytest.mark.parametrize("cls,param,field,want", CASES, ids=[f"{c.__name__}.{p}" for c, p, _, _ in CASES])
def test_documented_default_is_the_headers(cls, param, field, want):
    struct = "mc_engine_config" if cls is mg.TransferEngine else "mc_store_config"
    assert f"0: {want}" in header_comment(field, struct)
    assert doc_default(cls.__doc__, param) == want
