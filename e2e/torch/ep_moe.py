"""A small MoE layer for the Mooncake EP tests: the experts, the routing,
each rank's tokens (all derived from seeds, so the test process and every
worker build the same ones), and the single-process reference output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

import torch


@dataclass(frozen=True)
class Config:
    world: int = 2
    num_experts: int = 8
    hidden: int = 256
    ffn: int = 64
    tokens: int = 24  # tokens per rank in a step (<= max_tokens)
    max_tokens: int = 32  # num_max_dispatch_tokens_per_rank
    top_k: int = 3
    dtype: str = "float32"  # x's dtype: float32 or bfloat16
    fp8: bool = False
    seed: int = 1234

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.world


def weights(cfg: Config) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gate [hidden, E], w1 [E, hidden, ffn], w2 [E, ffn, hidden]), fp32."""
    g = torch.Generator().manual_seed(cfg.seed)
    gate = torch.randn(cfg.hidden, cfg.num_experts, generator=g)
    w1 = torch.randn(cfg.num_experts, cfg.hidden, cfg.ffn, generator=g) / cfg.hidden ** 0.5
    w2 = torch.randn(cfg.num_experts, cfg.ffn, cfg.hidden, generator=g) / cfg.ffn ** 0.5
    return gate, w1, w2


def tokens(cfg: Config, rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed * 1000 + step * 100 + rank)
    return torch.randn(cfg.tokens, cfg.hidden, generator=g).to(cfg.torch_dtype)


def route(cfg: Config, x: torch.Tensor, gate: torch.Tensor, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing with some choices masked to -1 (every 5th (token,
    choice) pair, shifted by rank): (topk_idx int64, topk_weights fp32)."""
    logits = x.to(torch.float32) @ gate
    w, idx = torch.topk(torch.softmax(logits, dim=-1), cfg.top_k, dim=-1)
    t = torch.arange(cfg.tokens)[:, None]
    k = torch.arange(cfg.top_k)[None, :]
    idx = torch.where((t + k + rank) % 5 == 0, torch.full_like(idx, -1), idx)
    return idx, w


def expert(w1: torch.Tensor, w2: torch.Tensor, e: int, rows: torch.Tensor) -> torch.Tensor:
    """Expert e on fp32 rows."""
    return torch.nn.functional.silu(rows @ w1[e]) @ w2[e]


def dequant_input(cfg: Config, x: torch.Tensor) -> torch.Tensor:
    """What an expert sees of x: x itself, or its fp8 round trip."""
    if not cfg.fp8:
        return x.to(torch.float32)
    from mooncake.mooncake_ep_buffer import _quantize, per_token_cast_back

    return per_token_cast_back(*_quantize(x, torch.float8_e4m3fn))


def out_dtype(cfg: Config) -> torch.dtype:
    """The dtype experts send back to combine (bf16 after fp8, as DeepEP)."""
    return torch.bfloat16 if cfg.fp8 else cfg.torch_dtype


def reference(cfg: Config, rank: int, step: int, dead: Iterable[int] = (),
              remap: Optional[List[int]] = None) -> torch.Tensor:
    """The MoE layer's output for rank's tokens of step, in one process:
    experts owned by ``dead`` ranks contribute nothing."""
    gate, w1, w2 = weights(cfg)
    x = tokens(cfg, rank, step)
    idx, w = route(cfg, x, gate, rank)
    xin = dequant_input(cfg, x)
    dead = set(dead)
    acc = torch.zeros(cfg.tokens, cfg.hidden)
    for t in range(cfg.tokens):
        for k in range(cfg.top_k):
            e = int(idx[t, k])
            if e < 0 or e // cfg.local_experts in dead:
                continue
            y = expert(w1, w2, e, xin[t:t + 1]).to(out_dtype(cfg)).to(torch.float32)
            acc[t] += w[t, k] * y[0]
    return acc.to(out_dtype(cfg))


def tolerance(cfg: Config) -> Tuple[float, float]:
    """(rtol, atol) between the distributed and the reference layer: fp32
    differs only by summation order; bf16 outputs by one bf16 rounding."""
    return (1e-5, 1e-5) if out_dtype(cfg) == torch.float32 else (1.6e-2, 1.6e-2)
