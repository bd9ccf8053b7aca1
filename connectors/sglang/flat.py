"""A batch's store arguments as flat arrays, built without work per page
in Python: where each page's pieces lie in a host pool (PoolLayout, worked
out once per pool) and the batch's keys as one C array (key_array).

SGLang's own get_page_buffer_meta walks the batch page by page in Python
(and piece by piece: one per layer of a layer_first pool), and the keys
would be formatted and encoded one by one; at 64 pages and more that is
most of the Python time of a batch. Both depend on the batch only through
a few numbers per page, so numpy computes them for the whole batch.
"""

from __future__ import annotations

import ctypes
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

from .keys import page_key

# The metadata functions whose every piece address is base + first * stride
# (first: the page's first token index) and whose sizes do not depend on
# the page: SGLang's MHA and MLA host pools' own (a subclass that
# overrides the function, or a pool of another kind, keeps its own).
_AFFINE_META = (MHATokenToKVPoolHost.get_page_buffer_meta, MLATokenToKVPoolHost.get_page_buffer_meta)


class PoolLayout:
    """Where a host pool keeps each page's pieces: piece j of the page whose
    first token is t lies at base[j] + t * stride[j], sizes[j] bytes long.
    Worked out once per pool from the pool's own get_page_buffer_meta and
    checked against it on pages across the pool (of): a batch then needs a
    few numpy operations, however many pages and pieces it has."""

    def __init__(self, base: Sequence[int], stride: Sequence[int], sizes: Sequence[int], page: int):
        self.base = np.asarray(base, dtype=np.int64)
        self.stride = np.asarray(stride, dtype=np.int64)
        self.per = len(self.base)
        self.page = page
        self.page_bytes = int(sum(sizes))
        self._one = np.asarray(sizes, dtype=np.uint64)
        self._sizes = self._one.copy()  # sizes of as many pages as the largest batch yet

    @classmethod
    def of(cls, pool) -> Optional["PoolLayout"]:
        """The pool's layout, or None where it is not of this form (pools
        of other kinds, a DCP-sharded pool, a function that disagrees on
        any page checked): such a pool's batches take its own metadata."""
        meta = getattr(type(pool), "get_page_buffer_meta", None)
        page = getattr(pool, "page_size", 0)
        size = getattr(pool, "size", 0)
        if meta not in _AFFINE_META or getattr(pool, "dcp_size", 1) != 1 or page <= 0 or size < 2 * page:
            return None
        pages = size // page
        try:
            got = {p: pool.get_page_buffer_meta(torch.arange(p * page, (p + 1) * page)) for p in
                   sorted({0, 1, 2 % pages, pages // 2, pages - 1})}
        except Exception:  # a layout the pool itself does not serve zero-copy
            return None
        base, sizes = got[0]
        ptrs1, _ = got[1]
        if not base or len(ptrs1) != len(base):
            return None
        steps = [b - a for a, b in zip(base, ptrs1)]
        if any(s % page for s in steps):
            return None
        lay = cls(base, [s // page for s in steps], sizes, page)
        for p, (ptrs, szs) in got.items():
            if list(szs) != list(sizes) or list(ptrs) != [a + p * page * s for a, s in zip(base, lay.stride.tolist())]:
                return None
        return lay

    def pieces(self, host_indices: torch.Tensor, n: int) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """(addresses, sizes) of the pieces of n pages at host_indices, every
        page's pieces in order, as C-contiguous 64-bit arrays; None where
        host_indices are not n whole pages on the CPU (the pool's own
        metadata then decides)."""
        if host_indices.device.type != "cpu" or host_indices.numel() != n * self.page:
            return None
        firsts = host_indices.numpy()[::self.page].astype(np.int64, copy=False)
        ptrs = (firsts[:, None] * self.stride + self.base).ravel()
        want = n * self.per
        sizes = self._sizes
        if len(sizes) < want:
            sizes = self._sizes = np.tile(self._one, n)
        return ptrs, sizes[:want]


# Below this many keys, formatting them one by one costs less than numpy's
# fixed cost (about 4 us).
_FEW = 12


def key_array(prefix: str, hashes: Sequence[str]):
    """The store keys of pages (keys.page_key of each hash) as one C array
    of n strings, ready for the library: for SGLang's hex page hashes built
    in one piece (one buffer of fixed-length keys, the array pointing into
    it), for a few keys or keys of another form one by one. The array keeps
    its buffer alive."""
    n = len(hashes)
    if n < _FEW:
        return (ctypes.c_char_p * n)(*[page_key(prefix, h).encode() for h in hashes])
    hexes = "".join([h[:16] for h in hashes])
    try:
        whole = len(hexes) == 16 * n and len(bytes.fromhex(hexes)) == 8 * n  # every key starts with 16 hex digits
    except ValueError:
        whole = False
    if not whole:
        return (ctypes.c_char_p * n)(*[page_key(prefix, h).encode() for h in hashes])
    head = np.frombuffer((prefix + "@").encode(), dtype=np.uint8)
    width = len(head) + 17  # prefix@, 16 digits, NUL
    blob = np.empty((n, width), dtype=np.uint8)
    blob[:, :len(head)] = head
    blob[:, len(head):-1] = np.frombuffer(hexes.lower().encode(), dtype=np.uint8).reshape(n, 16)
    blob[:, -1] = 0
    at = blob.ctypes.data
    ptrs = np.arange(at, at + n * width, width, dtype=np.uint64)
    arr = (ctypes.c_char_p * n).from_buffer(ptrs)
    arr._blob = blob  # the strings the array points into
    return arr


def key_strings(arr) -> List[str]:
    """The keys of a key_array, as strings (for messages)."""
    return [k.decode() for k in arr]
