"""Where a KV block lives in the KV cache tensors.

vLLM hands the connector one tensor per attention layer. Their shapes
differ by attention backend (vLLM 0.32's CPU backend: [num_blocks,
num_kv_heads, block_size, 2 * head_size], block-major; several GPU
backends: [2, num_blocks, ...], K and V apart), so the layout is read from
the tensor itself: the dimension of size num_blocks is the block
dimension, every index of the dimensions before it starts one run of
bytes, and the block's bytes under each such index must fill one range of
memory. That range may hold them in another order than the tensor's
dimensions (vLLM 0.26's FlashAttention cache on a GPU: [num_blocks,
num_kv_heads, block_size, 2 * head_size], K and V side by side in the last
dimension, viewed over memory laid out as [num_blocks, block_size,
num_kv_heads, 2 * head_size] with its default VLLM_KV_CACHE_LAYOUT=NHD, as
the shape says with HND): a block moves as the bytes it occupies. Runs of
equal strides and lengths may hold a block's elements in other orders
(NHD and HND do), so each run also has the order of its elements
(Layout.order), which a decode instance compares with the prefill
instance's before it pulls. The store cannot compare: instances sharing
one store must lay their blocks out alike.
Block b of a layer is then, for each run r, the bytes
``[r.base + b * r.stride, + r.length)``. A block's value in the store is
the concatenation of its runs over all layers, in layer order.
"""

from __future__ import annotations

import itertools
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple


class Run(NamedTuple):
    """One contiguous piece of every block: block b at base + b * stride."""

    base: int
    stride: int
    length: int


def _dense(t) -> bool:
    """Whether t's elements fill one range of memory, in any order of its
    dimensions: sorted by stride, each stride is the product of the sizes
    below it."""
    want = 1
    for n, s in sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n != 1), key=lambda p: p[1]):
        if s != want:
            return False
        want *= n
    return True


def tensor_runs(name: str, t, num_blocks: int) -> List[Run]:
    """The runs of tensor t (a layer's KV cache of num_blocks blocks)."""
    return [r for r, _ in _tensor_pieces(name, t, num_blocks)]


def _order(piece) -> List[int]:
    """How a block's elements lie in its run: size and stride (elements)
    of each dimension of more than one, in the tensor's order. Runs of
    equal lengths hold a block alike only where these agree."""
    return [x for n, s in zip(piece.shape, piece.stride()) if n != 1 for x in (n, s)]


def _tensor_pieces(name: str, t, num_blocks: int) -> List[Tuple[Run, List[int]]]:
    """The runs of tensor t with the order of a block's elements in each."""
    # CUDA caches are registered by address like CPU ones: the library finds
    # GPU memory through the CUDA driver vLLM has loaded and never touches
    # it with the CPU. Other accelerators' memory it cannot move.
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"mooncake-go connector: layer {name} is on {t.device}; CPU and CUDA KV caches are supported")
    shape, strides = list(t.shape), list(t.stride())
    dims = [d for d, n in enumerate(shape) if n == num_blocks]
    if not dims:
        raise ValueError(f"mooncake-go connector: layer {name} of shape {tuple(shape)} has no dimension "
                         f"of {num_blocks} blocks")
    d = dims[0]
    size = t.element_size()
    one = t.select(d, 0)
    lead = shape[:d]
    runs = []
    for idx in itertools.product(*(range(n) for n in lead)):
        piece = one[idx] if idx else one
        if not _dense(piece):
            raise ValueError(f"mooncake-go connector: a block of layer {name} (shape {tuple(shape)}, "
                             f"strides {tuple(strides)}) is not contiguous")
        off = sum(i * s for i, s in zip(idx, strides)) * size
        runs.append((Run(t.data_ptr() + off, strides[d] * size, piece.numel() * size), _order(piece)))
    return runs


class Layout:
    """The runs of every layer, in layer order, and the memory to register."""

    def __init__(self, kv_caches: Dict[str, object], num_blocks: int):
        self.layers = list(kv_caches)
        self.runs: List[Run] = []
        # Per run, how a block's elements lie in it (_order): published
        # with the runs, since equal runs may hold a block in other orders.
        self.order: List[List[int]] = []
        # Whether every block lies in its runs in its tensor's order, as
        # peers that publish no order required.
        self.contiguous = True
        regions: Dict[int, int] = {}
        for name, t in kv_caches.items():
            for run, order in _tensor_pieces(name, t, num_blocks):
                self.runs.append(run)
                self.order.append(order)
                self.contiguous &= order[1::2] == sorted(order[1::2], reverse=True)
            st = t.untyped_storage()
            regions[st.data_ptr()] = max(regions.get(st.data_ptr(), 0), st.nbytes())
        self.num_blocks = num_blocks
        self.device = next(iter(kv_caches.values())).device if kv_caches else None
        self.regions: List[Tuple[int, int]] = sorted(regions.items())
        self.block_bytes = sum(r.length for r in self.runs)

    def parts(self, block_id: int) -> Tuple[List[int], List[int]]:
        """Addresses and lengths of block block_id's runs."""
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"mooncake-go connector: block {block_id} out of range [0, {self.num_blocks})")
        return [r.base + block_id * r.stride for r in self.runs], [r.length for r in self.runs]

    def shape(self) -> List[Tuple[int, int]]:
        """(stride, length) of each run: equal shapes move blocks as they are."""
        return [(r.stride, r.length) for r in self.runs]


def compute_fence(layout: Layout):
    """What a save must wait for before it reads blocks: on a CUDA KV
    cache, an event recorded on the current stream after the kernels vLLM
    has queued so far; None on the CPU. vLLM calls wait_for_save once it
    has queued the forward pass, not once the GPU has run it, and the
    library's driver copies are not ordered after torch's streams (those
    are created non-blocking), so a save started at once could read the
    blocks before the pass has written them."""
    dev = layout.device
    if dev is None or dev.type != "cuda":
        return None
    import torch

    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(dev))
    return ev


def remote_mismatch(layout: Layout, worker: dict) -> Optional[str]:
    """Why blocks a peer's worker published (its "runs" and "order") cannot
    be read into this layout's blocks as they are, or None where they can.
    A peer that publishes no order accepted only blocks that lie in their
    tensor's order."""
    runs = worker["runs"]
    if [(s, n) for _, s, n in runs] != layout.shape():
        return "the prefill instance's KV cache layout differs from this one's"
    order = worker.get("order")
    if order is None:
        if not layout.contiguous:
            return ("the prefill instance publishes no element order, and this instance's blocks lie out of "
                    "their tensors' order")
    elif [list(o) for o in order] != layout.order:
        return ("the prefill instance's blocks hold their elements in another order than this one's "
                "(VLLM_KV_CACHE_LAYOUT or the attention backend differs)")
    return None


def remote_parts(runs: Sequence[Sequence[int]], block_id: int) -> List[int]:
    """Addresses of a remote block's runs, from the runs its owner published."""
    return [base + block_id * stride for base, stride, _ in runs]
