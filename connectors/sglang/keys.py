"""Store keys of HiCache pages.

A page is one object, ``<prefix>@<16 lower-case hex digits>``: the form of
the Conductor's block keys (conductor/storekey.go reads the last '@' field
as the block's 64-bit id), so the Conductor's store feed indexes SGLang's
pages as it indexes vLLM's blocks.

The 64-bit id of a page is the first 16 hex digits of SGLang's page hash
string (a SHA-256 hex digest chaining the whole prefix, and the request's
namespace: extra_key, cache salt), read as an unsigned number: the value
SGLang publishes as the block hash of its KV events
(sglang.srt.mem_cache.utils.hash_str_to_int64, there as a signed int64).
A string that does not start with 16 hex digits (a caller's own key) gets
the first 8 bytes, big-endian, of its SHA-256 instead.

The prefix says whose KV the page is: ``[<tenant>/]<name>@<part>``, name
being the model's basename (or the key_prefix setting) and part
``tp<rank>`` for MHA models, whose TP ranks each hold their own heads of
a page, or ``mla`` for MLA models, whose ranks hold the same latent and
share one object. ``pp<rank>`` follows with pipeline parallelism,
``cp<rank>`` with context parallelism and ``dcp<rank>`` with decode
context parallelism (each such rank holds its own shard of a page), and
``-lf`` marks a layer_first pool, whose page bytes are ordered otherwise.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Optional

_HEX16 = re.compile(r"^[0-9a-fA-F]{16}")


def page_id64(page_hash: str) -> int:
    """The 64-bit id of an SGLang page hash (see the module's doc)."""
    if _HEX16.match(page_hash):
        return int(page_hash[:16], 16)
    return int.from_bytes(hashlib.sha256(page_hash.encode()).digest()[:8], "big")


def page_key(prefix: str, page_hash: str) -> str:
    if _HEX16.match(page_hash):  # the id's digits are the hash's first 16, lower-cased
        return f"{prefix}@{page_hash[:16].lower()}"
    return f"{prefix}@{page_id64(page_hash):016x}"


def key_prefix(model: Optional[str], *, mla: bool, tp_rank: int = 0, pp_rank: int = 0, pp_size: int = 1,
               cp_rank: int = 0, cp_size: int = 1, dcp_rank: int = 0, dcp_size: int = 1,
               layer_first: bool = False, tenant: Optional[str] = None, name: Optional[str] = None) -> str:
    """``[<tenant>/]<name>@<tp<rank>|mla>[pp<r>][cp<r>][dcp<r>][-lf]`` (module doc)."""
    base = name or os.path.basename(str(model or "").rstrip("/")) or "model"
    for what, v in (("tenant", tenant), ("key_prefix", base)):
        if v and "@" in v:
            raise ValueError(f"mooncake-go hicache: {what} {v!r} must not contain '@'")
    part = "mla" if mla else f"tp{tp_rank}"
    for tag, rank, size in (("pp", pp_rank, pp_size), ("cp", cp_rank, cp_size), ("dcp", dcp_rank, dcp_size)):
        if size > 1:
            part += f"{tag}{rank}"
    if layer_first:
        part += "-lf"
    return f"{tenant}/{base}@{part}" if tenant else f"{base}@{part}"
