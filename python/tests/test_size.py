"""Sizes: the Python package reads "16GB" exactly as the CLI does (16 GiB,
as Mooncake), case for case, from the table the Go test reads too
(internal/size/testdata/cases.json)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from conftest import ROOT
from mooncake.store import _parse_size as compat_parse_size
from mooncake_go._size import parse_size

CASES = json.loads((ROOT / "internal" / "size" / "testdata" / "cases.json").read_text())["cases"]


def _connector_parser(framework: str):
    """connectors/<framework>/config.py's parse_size, loaded from its file:
    the package's __init__ imports the framework, the config module does not."""
    path = ROOT / "connectors" / framework / "config.py"
    spec = importlib.util.spec_from_file_location(f"_size_test_{framework}_config", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return lambda v: mod.parse_size(v, "segment_size")


PARSERS = {
    "mooncake_go": parse_size,
    "mooncake.store": compat_parse_size,  # MooncakeDistributedStore.setup's sizes
    "connectors.vllm": _connector_parser("vllm"),
    "connectors.lmcache": _connector_parser("lmcache"),
}


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("case", CASES, ids=[repr(c["in"]) for c in CASES])
def test_shared_table(parser, case):
    parse = PARSERS[parser]
    if case.get("error"):
        with pytest.raises(ValueError):
            got = parse(case["in"])
            pytest.fail(f"{case['in']!r} ({case['why']}) gave {got}")
    else:
        assert parse(case["in"]) == case["bytes"], case["why"]


@pytest.mark.parametrize(
    "value, want",
    [
        (4096, 4096),  # an int is bytes
        (1 << 40, 1 << 40),
        (3.0, 3),  # a float of whole bytes, as JSON configs give them
        (2e9, 2000000000),
    ],
)
def test_numbers(value, want):
    assert parse_size(value) == want


@pytest.mark.parametrize(
    "value",
    [
        True,  # a bool is an int to Python, never a size
        1.5,  # not whole bytes
        -1,  # no negative sizes
        1 << 63,  # past int64, which the library takes
        None,
    ],
)
def test_refused_numbers(value):
    with pytest.raises(ValueError):
        parse_size(value)


def test_error_names_setting_and_value():
    with pytest.raises(ValueError, match=r"segment_size.*'3 parsecs'"):
        PARSERS["connectors.vllm"]("3 parsecs")
