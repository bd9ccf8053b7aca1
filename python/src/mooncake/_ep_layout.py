"""Where things live in a Mooncake EP buffer, and the routing arithmetic
of one dispatch (internal to mooncake.mooncake_ep_buffer).

Every rank computes the same layout from the same call arguments
(num_ranks, num_experts, num_max_dispatch_tokens_per_rank, hidden), so a
sender knows the address of its slots in any peer's buffer without asking.
Offsets are in bytes from the start of the registered buffer::

    dispatch flags   [2][R] int64   source s writes its dispatch seq at [h][s]
    combine flags    [2][R] int64   expert rank r writes the combine seq at [h][r]
    counts received  [2][R][L] int32  source s's token count per local expert
    counts to send   [R][L] int32   (local scratch, the source of those writes)
    flag word        [2] int64      (local scratch, the source of flag writes)
    send staging     E*T rows       packed rows this rank is about to write
    dispatch recv    [2] x E*T rows [L][R][T]: local expert, source, slot
    combine recv     [2] x E*T rows [E][T]: global expert, slot (dispatch order)

R ranks, L = E/R local experts, T = num_max_dispatch_tokens_per_rank. The
two halves ([2]) alternate by sequence number, so a fast rank's next call
never lands in slots a slow rank is still reading (it cannot start call
k+2 before every peer finished call k+1, which they start only after
reading call k). Data rows are sized for the largest row (fp32: hidden*4
bytes); a call whose rows are smaller (bf16, fp8 with scales) packs them
at its own stride inside the same regions.
"""

from __future__ import annotations

from typing import NamedTuple

#: Channels per fp8 scale (DeepEP's per-token-group quantisation).
FP8_GROUP = 128
#: The largest finite float8_e4m3fn value, the target of each group's amax.
FP8_MAX = 448.0

_ALIGN = 4096


def _align(n: int, a: int = 64) -> int:
    return (n + a - 1) // a * a


class Layout(NamedTuple):
    """Byte offsets of one (R, E, T, hidden) configuration."""

    num_ranks: int
    num_experts: int
    num_tokens: int  # T, the per-rank maximum
    hidden: int
    dispatch_flags: int
    combine_flags: int
    counts_recv: int
    counts_send: int
    flag_word: int
    staging: int
    dispatch_recv: int
    combine_recv: int
    region: int  # bytes of one data region (E*T rows of hidden*4 bytes)
    total: int

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.num_ranks

    def dispatch_flag(self, half: int, src: int) -> int:
        return self.dispatch_flags + (half * self.num_ranks + src) * 8

    def combine_flag(self, half: int, src: int) -> int:
        return self.combine_flags + (half * self.num_ranks + src) * 8

    def counts_from(self, half: int, src: int) -> int:
        return self.counts_recv + (half * self.num_ranks + src) * self.local_experts * 4

    def dispatch_slot(self, half: int, local_expert: int, src: int, stride: int) -> int:
        """The first slot source src fills for local_expert, rows of stride bytes."""
        row = (local_expert * self.num_ranks + src) * self.num_tokens
        return self.dispatch_recv + half * self.region + row * stride

    def combine_slot(self, half: int, expert: int, stride: int) -> int:
        """The first slot of global expert's results for this (source) rank."""
        return self.combine_recv + half * self.region + expert * self.num_tokens * stride


def layout(num_ranks: int, num_experts: int, num_tokens: int, hidden: int) -> Layout:
    """The layout of a buffer serving calls with these arguments."""
    r, e = num_ranks, num_experts
    lx = e // r
    off = 0
    dispatch_flags = off
    off += 2 * r * 8
    combine_flags = off
    off += 2 * r * 8
    counts_recv = off
    off = _align(off + 2 * r * lx * 4)
    counts_send = off
    off = _align(off + r * lx * 4)
    flag_word = off
    off = _align(off + 16, _ALIGN)
    region = _align(e * num_tokens * hidden * 4, _ALIGN)
    staging = off
    off += region
    dispatch_recv = off
    off += 2 * region
    combine_recv = off
    off += 2 * region
    return Layout(r, e, num_tokens, hidden, dispatch_flags, combine_flags, counts_recv, counts_send, flag_word,
                  staging, dispatch_recv, combine_recv, region, off)
