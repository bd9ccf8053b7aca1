"""The connector's settings (kv_connector_extra_config) and its store keys.

Store keys are ``<prefix>@<16 lower-case hex digits>``: the hex is the
block's 64-bit identity, the low 64 bits of vLLM's block hash read
big-endian (what vLLM publishes in its KV events with
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), and the Conductor's store feed
indexes keys by it (conductor/storekey.go: the last '@' field). The prefix
is ``<model>@tp<rank>`` (``<tenant>/<model>@tp<rank>`` with a tenant):
instances of one model and rank share blocks, other models or tenants do
not. vLLM's block hashes already chain the whole prefix (and cache salt,
LoRA and multimodal inputs), so equal keys mean equal KV.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from mooncake_go import parse_size as _parse_size

_MASK64 = (1 << 64) - 1


def parse_size(v: Any, name: str) -> int:
    """Bytes from an int or a string like "64MB", "1GiB", "512k": every unit
    1024-based, as Mooncake reads them (mooncake_go's one parser, which the
    CLI agrees with)."""
    try:
        return _parse_size(v)
    except ValueError as e:
        raise ValueError(f"mooncake-go connector: {name}: {e}") from e


def block_id64(block_hash: Any) -> int:
    """The 64-bit identity of a vLLM block hash (bytes; an int passes)."""
    if isinstance(block_hash, int):
        return block_hash & _MASK64
    return int.from_bytes(bytes(block_hash), "big") & _MASK64


def block_key(prefix: str, block_hash: Any) -> str:
    return f"{prefix}@{block_id64(block_hash):016x}"


def key_prefix(model: str, tp_rank: int, tenant: Optional[str] = None, name: Optional[str] = None) -> str:
    """``[<tenant>/]<model basename>@tp<rank>``; name replaces the model's basename."""
    base = name or os.path.basename(str(model).rstrip("/")) or "model"
    for what, v in (("tenant", tenant), ("key_prefix", base)):
        if v and "@" in v:
            raise ValueError(f"mooncake-go connector: {what} {v!r} must not contain '@'")
    return f"{tenant}/{base}@tp{tp_rank}" if tenant else f"{base}@tp{tp_rank}"


@dataclass
class Settings:
    """kv_connector_extra_config, with defaults.

    master: the store master "host:port" (no store tier without it).
    segment_size: memory this instance lends the store pool; 0 lends none
        (blocks then live on the pool's other members, e.g. `mooncake up`'s
        nodes, and outlive this instance).
    local_buffer_size: the store client's staging memory (the KV cache is
        registered, so transfers need little).
    tenant, key_prefix: see key_prefix().
    host: the address this instance's engines listen on and peers reach
        [the library's choice: the first non-loopback IPv4].
    load_timeout: seconds a store load or a PD pull may take before its
        blocks are reported failed (vLLM recomputes them).
    lookup_timeout: seconds the scheduler waits for the store's answer on
        which blocks it holds; store_retry: seconds the store is left alone
        after it failed.
    pd_free_timeout: seconds a prefill instance keeps a request's blocks
        for a decode instance that never pulls them.
    save / load: the store tier's directions [save for kv_producer and
        kv_both, load for kv_consumer and kv_both].
    """

    master: Optional[str] = None
    segment_size: int = 0
    local_buffer_size: int = 16 << 20
    tenant: Optional[str] = None
    key_prefix: Optional[str] = None
    host: Optional[str] = None
    load_timeout: float = 10.0
    lookup_timeout: float = 2.0
    store_retry: float = 10.0
    pd_free_timeout: float = 120.0
    save: bool = True
    load: bool = True

    @classmethod
    def from_config(cls, extra: Optional[Mapping[str, Any]], role: str) -> "Settings":
        extra = dict(extra or {})
        s = cls(save=role in ("kv_producer", "kv_both"), load=role in ("kv_consumer", "kv_both"))
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"mooncake-go connector: unknown kv_connector_extra_config keys {unknown}; "
                             f"known: {sorted(known)}")
        for k, v in extra.items():
            if k in ("segment_size", "local_buffer_size"):
                v = parse_size(v, k)
            elif k in ("load_timeout", "lookup_timeout", "store_retry", "pd_free_timeout"):
                v = float(v)
                if v <= 0:
                    raise ValueError(f"mooncake-go connector: {k} must be positive, not {v}")
            elif k in ("save", "load"):
                v = bool(v)
            setattr(s, k, v)
        return s
