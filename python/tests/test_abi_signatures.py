"""The ctypes prototypes of mooncake_go._lib against include/mooncake.h.

_lib's table of prototypes is a second, hand-written copy of the header's
function declarations; ctypes converts arguments by it and nothing else
checks it. A parameter missed or of the wrong width there shifts every
argument after it (an fd read as the high half of an offset, a pointer as
a length) and the call goes wrong without an error. Each prototype must
have the header's parameters, in order: the same integer width and
signedness, pointers to the same thing (a void * may stand for a pointer
to structs), and the trailing mc_error_t *.
"""

from __future__ import annotations

import ctypes
import re

import pytest
from conftest import ROOT
from test_abi_layout import CLASSES

from mooncake_go import _lib

HEADER = ROOT / "include" / "mooncake.h"

_INTS = {"int8_t": ("i", 1), "uint8_t": ("u", 1), "int16_t": ("i", 2), "uint16_t": ("u", 2),
         "int32_t": ("i", 4), "uint32_t": ("u", 4), "int64_t": ("i", 8), "uint64_t": ("u", 8),
         "int": ("i", ctypes.sizeof(ctypes.c_int)), "size_t": ("u", ctypes.sizeof(ctypes.c_size_t))}


def _header_text() -> str:
    return re.sub(r"/\*.*?\*/", " ", HEADER.read_text(), flags=re.S)


def _aliases(text: str) -> dict[str, str]:
    """`typedef <int type> name;` of the header (handles, mc_status_t)."""
    return dict((new, old) for old, new in re.findall(r"typedef\s+(\w+)\s+(\w+)\s*;", text))


def header_functions() -> dict[str, tuple[str, list[str]]]:
    """Each function the header declares: (return type, parameter declarations)."""
    text = _header_text()
    out = {}
    for ret, name, params in re.findall(r"^\s*([\w ]+?\**)\s*\b(mc_\w+)\s*\(([^)]*)\)\s*;", text, flags=re.M):
        ps = [" ".join(p.split()) for p in params.split(",")]
        out[name] = (ret.strip(), [] if ps == ["void"] else ps)
    return out


def c_kind(decl: str, aliases: dict[str, str]) -> tuple:
    """A parameter declaration as (base, pointer depth): base is ('i'|'u',
    width) for integers, else the type's name (char, void, a struct)."""
    decl = re.sub(r"\bconst\b", " ", decl)
    stars = decl.count("*")
    words = decl.replace("*", " ").split()
    if len(words) > 1:
        words = words[:-1]  # the parameter's name
    base = words[-1]
    while base in aliases:
        base = aliases[base]
    return (_INTS.get(base, base), stars)


_STRUCTS = {cls: name for name, cls in CLASSES.items()}


def ctypes_kind(t) -> tuple:
    """A ctypes type as c_kind describes the C one."""
    if t is ctypes.c_char_p:
        return ("char", 1)
    if t is ctypes.c_void_p:
        return ("void", 1)
    if t in _STRUCTS:
        return (_STRUCTS[t], 0)
    if hasattr(t, "_type_") and issubclass(t, ctypes._Pointer):
        base, stars = ctypes_kind(t._type_)
        return (base, stars + 1)
    if issubclass(t, ctypes._SimpleCData) and t._type_ in "bBhHiIlLqQ":
        return (("u" if t._type_.isupper() else "i", ctypes.sizeof(t)), 0)
    raise AssertionError(f"no C counterpart known for {t!r}")


def test_every_bound_function_is_declared():
    missing = sorted(set(_lib._SIGNATURES) - set(header_functions()))
    assert not missing, f"_lib binds functions include/mooncake.h does not declare: {missing}"


@pytest.mark.parametrize("name", sorted(_lib._SIGNATURES))
def test_prototype_matches_header(name):
    funcs, aliases = header_functions(), _aliases(_header_text())
    ret, params = funcs[name]
    res, args = _lib._SIGNATURES[name]
    assert c_kind(ret, aliases) == ctypes_kind(res), f"{name} returns {ret}, _lib says {res}"
    assert params and c_kind(params[-1], aliases) == ("mc_error_t", 1), f"{name}: last parameter {params[-1:]}"
    want = [c_kind(p, aliases) for p in params[:-1]]
    got = [ctypes_kind(a) for a in args]
    assert len(got) == len(want), f"{name}: _lib has {len(got)} parameters before err, the header {len(want)}: {params}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g == ("void", 1) and w[1] == 1 and isinstance(w[0], str):
            continue  # an array of structs passed by its address: the same pointer
        assert g == w, f"{name} parameter {i} ({params[i]}): _lib {args[i]!r} is {g}, the header's is {w}"


def test_a_shifted_parameter_is_caught(monkeypatch):
    """The check itself: mc_dummy_register_shared with its fd dropped (the
    offset then goes where the fd should) fails it."""
    res, args = _lib._SIGNATURES["mc_dummy_register_shared"]
    monkeypatch.setitem(_lib._SIGNATURES, "mc_dummy_register_shared", (res, [args[0]] + args[2:]))
    with pytest.raises(AssertionError, match="parameters before err"):
        test_prototype_matches_header("mc_dummy_register_shared")
    monkeypatch.setitem(_lib._SIGNATURES, "mc_dummy_register_shared",
                        (res, [args[0], ctypes.c_uint64] + args[2:]))
    with pytest.raises(AssertionError, match="parameter 1"):
        test_prototype_matches_header("mc_dummy_register_shared")
