"""Golden block-hash vectors for conductor/blockhash.

vLLM's own functions compute the vLLM cases (hash_block_tokens,
init_none_hash, get_hash_fn_by_name, maybe_convert_block_hash), so the Go
package is checked against the engine and not against a second reading of
it. The Mooncake standard (XXH3-64 rolling sequence hash) and our FNV
scheme have no reference implementation installed: they are written here
from their definitions, independently of the Go code, with Python's
xxhash module for XXH3.

Run with the vLLM venv's python; vLLM's xxhash algorithms and the
Mooncake cases need the xxhash module, an optional vLLM dependency:

    pip install --target /tmp/xxhash-py xxhash
    PYTHONPATH=/tmp/xxhash-py ~/.cache/mooncake-go/e2e/vllm/bin/python \\
        e2e/vllm/gen_block_hashes.py conductor/blockhash/testdata/vllm_vectors.json

The output is deterministic: the same vLLM and xxhash give the same file.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import struct
import sys

# vLLM resolves NONE_HASH's seed and the int form of block ids from the
# environment; start from the engine defaults whatever the caller's shell has.
os.environ.pop("PYTHONHASHSEED", None)
os.environ.pop("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", None)

try:
    import xxhash
except ImportError:
    sys.exit("gen_block_hashes: the xxhash module is missing (see the docstring)")

import vllm
import vllm.v1.core.kv_cache_utils as kcu
from vllm.utils.hashing import get_hash_fn_by_name

U64 = (1 << 64) - 1
FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211

# Token ids that change the width of their pickle opcode or CBOR head:
# BININT1/BININT2/BININT/LONG1 and CBOR's 1/2/4/8-byte arguments, both signs.
EDGE_IDS = [
    0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1,
    2**32, 2**40, 2**63 - 1, -1, -24, -25, -128, -129, -256, -257,
    -(2**31), -(2**31) - 1, -(2**63),
]
# The widest LONG1 ids: a 4096-token block of them is the largest pickle the
# Go side accepts, and must still fit pickle's first 64 KiB frame.
WIDE_IDS = [2**63 - 1, -(2**63), -(2**62) - 1, 2**62]
LONG_SEED = "0123456789" * 30


def tokens(rng: random.Random, n: int, hi: int = 152064) -> list[int]:
    return [rng.randrange(hi) for _ in range(n)]


def token_cases() -> list[tuple[str, int, list[int]]]:
    """(name, block size, tokens) for every scheme."""
    rng = random.Random(20260801)
    cases = [
        ("empty", 16, []),
        ("partial block", 16, tokens(rng, 10)),
        ("one block", 16, tokens(rng, 16)),
        ("many blocks and a partial", 16, tokens(rng, 16 * 9 + 7)),
        ("block size 1", 1, [0, 255, 256, 65535, 65536]),
        ("block size 2", 2, tokens(rng, 6)),
        ("block size 3", 3, tokens(rng, 9)),
        ("block size 4", 4, tokens(rng, 9)),
        ("block size 128", 128, tokens(rng, 128 * 3 + 5)),
        ("edge ids", 16, EDGE_IDS + tokens(rng, 2 * 16 - len(EDGE_IDS))),
        ("edge ids, block size 1", 1, EDGE_IDS),
        ("large ids", 16, tokens(rng, 48, hi=2**31)),
        ("block size 4096, widest ids", 4096,
         [WIDE_IDS[i % len(WIDE_IDS)] for i in range(4096 * 2 + 3)]),
    ]
    for bs in (5, 8, 15, 30, 32, 60, 61, 62, 64, 100, 256, 512):
        # XXH3 switches code paths at 16, 128 and 240 input bytes; these
        # sizes put the Mooncake scheme's 4*bs-byte inputs on every side.
        cases.append((f"block size {bs}", bs, tokens(rng, bs * 3 + 1)))
    return cases


def vllm_results(cases: list[tuple[str, int, list[int]]]) -> list[dict]:
    out = []
    for algo in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
        hash_fn = get_hash_fn_by_name(algo)
        # "" is the engine default, the fixed seed of the cryptographic
        # algorithms; the xxhash ones are random without PYTHONHASHSEED, so
        # only explicit seeds are reproducible there.
        seeds = ["", "0", "42", "random"] if "sha256" in algo else ["0", "42", "4294967295"]
        # A seed of 256 bytes or more is pickled as BINUNICODE, not
        # SHORT_BINUNICODE, and takes a 2-byte CBOR head: a few cases suffice.
        seeds.append(LONG_SEED)
        for seed in seeds:
            if seed:
                os.environ["PYTHONHASHSEED"] = seed
            else:
                os.environ.pop("PYTHONHASHSEED", None)
            kcu.init_none_hash(hash_fn)
            for c, (_, bs, toks) in enumerate(cases):
                if seed == LONG_SEED and c >= 4:
                    break
                if bs == 4096:
                    check_one_frame(toks[:bs])
                hashes, parent = [], None
                for i in range(len(toks) // bs):
                    parent = kcu.hash_block_tokens(hash_fn, parent, toks[i * bs:(i + 1) * bs], None)
                    hashes.append(parent)
                out.append({
                    "case": c, "algo": algo, "seed": seed,
                    "none_hash": bytes(kcu.NONE_HASH).hex(),
                    "hashes": [h.hex() for h in hashes],
                    "ids": [kcu.maybe_convert_block_hash(h) for h in hashes],
                })
    os.environ.pop("PYTHONHASHSEED", None)
    return out


# Request extras vLLM hashes into blocks: (lora name, lora path, cache_salt).
# A salt of 256 bytes or more is BINUNICODE in pickle and takes a 2-byte
# CBOR head; non-ASCII text is counted in UTF-8 bytes by both.
EXTRAS = [
    ("sql-lora", "/models/sql-lora", ""),
    ("", "", "tenant-a"),
    ("sql-lora", "/models/sql-lora", "tenant-a"),
    ("adapter", "/a", "s\u00e4lz \u00fc\u4e2d\U0001f600"),
    ("", "", "salt" * 70),
]
# Cases small enough to cover every extra without bloating the file:
# several blocks and a partial, block size 1 (many blocks), edge ids.
EXTRA_CASES = ("many blocks and a partial", "block size 1", "edge ids")


class ExtraRequest:
    """The fields of vLLM's Request that generate_block_hash_extra_keys
    reads, for a text-only request."""

    def __init__(self, lora: str, path: str, salt: str):
        from vllm.lora.request import LoRARequest
        self.lora_request = LoRARequest(lora, 1, path) if lora else None
        self.cache_salt = salt or None
        self.mm_features = []
        self.prompt_embeds = None


def vllm_extra_results(cases: list[tuple[str, int, list[int]]]) -> list[dict]:
    """vLLM's hashes of requests with a LoRA adapter or a cache_salt, the
    extra keys from vLLM's own generate_block_hash_extra_keys."""
    out = []
    os.environ.pop("PYTHONHASHSEED", None)
    for algo in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
        hash_fn = get_hash_fn_by_name(algo)
        seed = "" if "sha256" in algo else "42"
        if seed:
            os.environ["PYTHONHASHSEED"] = seed
        kcu.init_none_hash(hash_fn)
        for c, (name, bs, toks) in enumerate(cases):
            if name not in EXTRA_CASES:
                continue
            for lora, path, salt in EXTRAS:
                req = ExtraRequest(lora, path, salt)
                hashes, parent = [], None
                for i in range(len(toks) // bs):
                    keys, _ = kcu.generate_block_hash_extra_keys(req, i * bs, (i + 1) * bs, 0)
                    parent = kcu.hash_block_tokens(hash_fn, parent, toks[i * bs:(i + 1) * bs], keys)
                    hashes.append(parent)
                out.append({
                    "case": c, "algo": algo, "seed": seed,
                    "lora_name": lora, "lora_path": path, "cache_salt": salt,
                    "hashes": [h.hex() for h in hashes],
                    "ids": [kcu.maybe_convert_block_hash(h) for h in hashes],
                })
        os.environ.pop("PYTHONHASHSEED", None)
    return out


def check_one_frame(block: list[int]) -> None:
    """The Go encoder writes a single pickle frame; prove the largest block
    it accepts needs no second one (a FRAME opcode is 0x95 + 8-byte length)."""
    b = pickle.dumps((b"\0" * 32, tuple(block), None), protocol=5)
    (frame_len,) = struct.unpack_from("<Q", b, 3)
    assert b[2] == 0x95 and frame_len == len(b) - 11, "largest block needs a second pickle frame"


def mooncake_ids(seed: int, bs: int, toks: list[int]) -> list[int]:
    ids, prev = [], None
    for i in range(len(toks) // bs):
        block = toks[i * bs:(i + 1) * bs]
        local = xxhash.xxh3_64_intdigest(struct.pack(f"<{bs}I", *[t & 0xFFFFFFFF for t in block]), seed)
        prev = local if prev is None else xxhash.xxh3_64_intdigest(struct.pack("<QQ", prev, local), seed)
        ids.append(prev)
    return ids


def fnv_ids(bs: int, toks: list[int]) -> list[int]:
    def feed(h: int, data: bytes) -> int:
        for c in data:
            h = ((h ^ c) * FNV_PRIME) & U64
        return h

    ids, prev = [], None
    for i in range(len(toks) // bs):
        h = FNV_OFFSET if prev is None else feed(FNV_OFFSET, struct.pack("<Q", prev))
        h = feed(h, struct.pack(f"<{bs}Q", *[t & U64 for t in toks[i * bs:(i + 1) * bs]]))
        ids.append(h)
        prev = h
    return ids


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: gen_block_hashes.py OUT.json")
    cases = token_cases()
    # The Conductor's own block size, for the FNV scheme that must keep
    # conductor.HashTokens' values.
    rng = random.Random(512)
    cases.append(("block size 512, three blocks and a partial", 512, tokens(rng, 512 * 3 + 100)))
    # Every result names its case by index, so each token list is stored once.
    doc = {
        "generator": "e2e/vllm/gen_block_hashes.py",
        "vllm_version": vllm.__version__,
        "xxhash_version": xxhash.VERSION,
        "cases": [{"name": name, "block_size": bs, "tokens": toks} for name, bs, toks in cases],
        "vllm": vllm_results(cases),
        "vllm_extra": vllm_extra_results(cases),
        "mooncake": [
            {"case": c, "seed": seed, "ids": mooncake_ids(seed, bs, toks)}
            for seed in (0, 1, 2**64 - 1)
            for c, (_, bs, toks) in enumerate(cases)
        ],
        "fnv": [{"case": c, "ids": fnv_ids(bs, toks)} for c, (_, bs, toks) in enumerate(cases)],
    }
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
