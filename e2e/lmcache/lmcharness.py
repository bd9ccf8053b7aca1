"""Helpers of the LMCache suite: LMCache's engine config and metadata for a
small model, its chunk keys for some tokens, memory objects filled with
random bytes, and the check that compares what came back with what went in.
"""

from __future__ import annotations

import ctypes
import random

import torch

from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.token_database import ChunkedTokenDatabase

CHUNK = 16  # tokens per LMCache chunk
# (layers, k/v, tokens, heads, head size) in bf16: 4 KiB per full chunk.
KV_SHAPE = (2, 2, CHUNK, 4, 8)
MODEL = "e2e-tiny"


def metadata() -> LMCacheMetadata:
    """One worker of a two-layer model, as the vLLM adapter would describe it."""
    return LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=KV_SHAPE,
                           chunk_size=CHUNK)


def engine_config(**overrides) -> LMCacheEngineConfig:
    """LMCache's engine config with a small CPU pool (its pinned buffer is
    what the connector registers with the store)."""
    base = dict(chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05, remote_serde="naive")
    base.update(overrides)
    return LMCacheEngineConfig.from_defaults(**base)


def mooncake_settings(master: str) -> dict:
    """The Mooncake keys LMCache's docs put in MOONCAKE_CONFIG_PATH (or,
    prefixed with mooncake_, in extra_config): a 32 MiB segment per client
    so objects land on the node and on the clients."""
    return {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": master,
        "global_segment_size": str(32 << 20),
        "local_buffer_size": str(16 << 20),
        "protocol": "tcp",
    }


def chunk_keys(tokens: list[int], cfg: LMCacheEngineConfig) -> list[tuple[int, int, object]]:
    """(start, end, CacheEngineKey) per chunk of tokens, from LMCache's own
    token database (the keys its engine stores and looks up)."""
    db = ChunkedTokenDatabase(cfg, metadata())
    return [(s, e, k) for s, e, k in db.process_tokens(tokens)]


def random_tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 32000) for _ in range(n)]


def fill(obj, seed: int) -> bytes:
    """Fills a MemoryObj with random bytes; returns a copy of them."""
    n = len(obj.byte_array)  # the chunk's bytes (its block may be larger)
    data = random.Random(seed).randbytes(n)
    ctypes.memmove(obj.data_ptr, data, n)
    return data


def mismatches(want: bytes, got) -> int:
    """How many bytes differ (a length difference counts in full); 0 = same."""
    got = bytes(got)
    n = min(len(want), len(got))
    a = torch.frombuffer(bytearray(want[:n]), dtype=torch.uint8)
    b = torch.frombuffer(bytearray(got[:n]), dtype=torch.uint8)
    return int((a != b).sum()) + abs(len(want) - len(got))
