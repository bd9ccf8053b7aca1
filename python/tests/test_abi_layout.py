"""The ctypes structs of mooncake_go._lib against include/mooncake.h.

ctypes is a second, hand-written copy of the header's structs; nothing else
checks that the two agree, and a field out of place there reads and
writes the wrong bytes without an error. A tiny C program compiled against
the header prints the offset and size of every field of every struct the
header defines, and the size of each struct; the ctypes classes must match
them field by field, in order.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from mooncake_go import _lib

HEADER = ROOT / "include" / "mooncake.h"

# The ctypes class of each struct of the header. A struct added to the
# header needs its class here (test_every_struct_has_a_class says so).
CLASSES = {
    "mc_error_t": _lib.Error,
    "mc_engine_config_t": _lib.EngineConfig,
    "mc_request_t": _lib.Request,
    "mc_transfer_status_t": _lib.TransferStatus,
    "mc_buffer_desc_t": _lib.BufferDesc,
    "mc_notify_t": _lib.Notify,
    "mc_store_config_t": _lib.StoreConfig,
    "mc_replicate_config_t": _lib.ReplicateConfig,
    "mc_replica_desc_t": _lib.ReplicaDesc,
}


def header_structs() -> dict[str, list[str]]:
    """Each `typedef struct x {...} x_t;` of the header: its field names."""
    text = re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)
    structs = {}
    for body, name in re.findall(r"typedef\s+struct\s+\w+\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = decl.strip()
            if decl:
                fields.append(re.search(r"(\w+)\s*(\[[^\]]*\])?$", decl).group(1))
        structs[name] = fields
    return structs


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory) -> dict[str, dict[str, tuple[int, int]]]:
    """struct -> field -> (offset, size) as the C compiler lays them out;
    the struct's own size under the field name ''."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc or cc) to lay the header's structs out with")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "mooncake.h"', "int main(void) {"]
    for struct, fields in header_structs().items():
        lines.append(f'    printf("{struct} - 0 %zu\\n", sizeof({struct}));')
        for f in fields:
            lines.append(
                f'    printf("{struct} {f} %zu %zu\\n", offsetof({struct}, {f}), sizeof((({struct} *)0)->{f}));'
            )
    lines += ["    return 0;", "}"]
    d: Path = tmp_path_factory.mktemp("abi")
    (d / "layout.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", f"-I{HEADER.parent}", "-o", str(d / "layout"), str(d / "layout.c")],
                   check=True)
    out = subprocess.run([str(d / "layout")], check=True, capture_output=True, text=True).stdout
    layout: dict[str, dict[str, tuple[int, int]]] = {}
    for line in out.splitlines():
        struct, field, off, size = line.split()
        layout.setdefault(struct, {})["" if field == "-" else field] = (int(off), int(size))
    return layout


def mismatches(cls: type[ctypes.Structure], struct: str, c: dict[str, tuple[int, int]]) -> list[str]:
    """How the ctypes class cls differs from the C layout c of struct."""
    out = []
    names = [f[0] for f in cls._fields_]
    want = [f for f in c if f]
    if names != want:
        out.append(f"{cls.__name__} fields {names}, header's {struct} has {want}")
    for name in names:
        if name in c:
            got = (getattr(cls, name).offset, getattr(cls, name).size)
            if got != c[name]:
                out.append(f"{cls.__name__}.{name} at offset {got[0]} size {got[1]}, header: offset {c[name][0]} size {c[name][1]}")
    if ctypes.sizeof(cls) != c[""][1]:
        out.append(f"sizeof {cls.__name__} {ctypes.sizeof(cls)}, header's {struct} {c[''][1]}")
    return out


def test_header_parses():
    # The parser found the structs, with their fields: an empty result would
    # make the other tests pass vacuously.
    structs = header_structs()
    assert structs["mc_engine_config_t"][:2] == ["struct_size", "lanes"]
    assert structs["mc_error_t"] == ["code", "domain", "message"]
    assert structs["mc_replicate_config_t"][-1] == "stripe_count"


def test_every_struct_has_a_class():
    assert sorted(header_structs()) == sorted(CLASSES)


@pytest.mark.parametrize("struct", sorted(CLASSES))
def test_ctypes_matches_header(struct, c_layout):
    assert mismatches(CLASSES[struct], struct, c_layout[struct]) == []


def test_a_reordered_field_is_caught(c_layout):
    # The check itself: StoreConfig with two fields swapped (same types, so
    # the size stays) must be reported, by name and by offset.
    fields = list(_lib.StoreConfig._fields_)
    i = [f[0] for f in fields].index("segment_size")
    fields[i], fields[i + 1] = fields[i + 1], fields[i]
    swapped = type("StoreConfig", (ctypes.Structure,), {"_fields_": fields})
    found = mismatches(swapped, "mc_store_config_t", c_layout["mc_store_config_t"])
    assert any("fields" in m for m in found)
    assert any("StoreConfig.segment_size at offset" in m for m in found)
