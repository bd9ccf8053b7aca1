"""Byte counts as Mooncake spells them, the package's one size parser.

Every unit is binary, with or without "i" and "B": K, KB, KiB = 1024;
M, MB, MiB = 1024**2; G, GB, GiB = 1024**3; T, TB, TiB = 1024**4; any
case. "16GB" is 16 GiB, as Mooncake and the frameworks' Mooncake configs
read it. A fraction is allowed when it names whole bytes ("1.5K" = 1536).
The CLI's parser (internal/size in Go) agrees case for case: both are
tested against internal/size/testdata/cases.json.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_INT64_MAX = (1 << 63) - 1
# Digits with at most one point (re.ASCII: no other scripts' digits), then a
# unit; the unit's letters are checked below.
_SIZE = re.compile(r"\s*(\d*\.?\d*)\s*([a-z]*)\s*", re.IGNORECASE | re.ASCII)
_SHIFTS = {"": 0, "b": 0}
for _i, _letter in enumerate("kmgt", start=1):
    for _suffix in ("", "b", "i", "ib"):
        _SHIFTS[_letter + _suffix] = 10 * _i


def parse_size(v: Any) -> int:
    """Bytes from an int, a float of whole bytes, or a string like "16GB",
    "512MiB", "1.5K", "4096" (units 1024-based). Raises ValueError naming v
    for anything else: a negative or fractional count, an unknown unit, a
    bool."""
    if isinstance(v, bool):
        raise ValueError(f"size {v!r}: want a number of bytes, not a bool")
    if isinstance(v, int):
        n = v
    elif isinstance(v, float):
        if not v.is_integer():
            raise ValueError(f"size {v!r} is not a whole number of bytes")
        n = int(v)
    else:
        n = _parse_str(str(v))
    if not 0 <= n <= _INT64_MAX:
        raise ValueError(f"size {v!r}: want 0 to {_INT64_MAX} bytes")
    return n


def _parse_str(s: str) -> int:
    m = _SIZE.fullmatch(s)
    num, unit = (m.group(1), m.group(2).lower()) if m else ("", "")
    if not m or num.strip(".") == "" or unit not in _SHIFTS:
        raise ValueError(
            f"size {s!r}: want a whole number of bytes with an optional unit "
            "(K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB; all 1024-based)"
        )
    # Fraction, not float: exact past 2**53, and 0.1K stays 102.4, not whole.
    n = Fraction(num if not num.endswith(".") else num + "0") * (1 << _SHIFTS[unit])
    if n.denominator != 1:
        raise ValueError(f"size {s!r} is not a whole number of bytes")
    return int(n)
