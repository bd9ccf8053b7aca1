"""Mooncake EP on CPU: expert-parallel dispatch and combine with rank
activeness, over mooncake-go's Transfer Engine.

The official module (``mooncake.mooncake_ep_buffer.Buffer``, an adaptation
of DeepEP's low-latency API) runs on GPUs; this one keeps its names,
arguments and return tuples and runs on CPU tensors::

    from mooncake.mooncake_ep_buffer import Buffer

    nbytes = Buffer.get_ep_buffer_size_hint(T, hidden, world, num_experts)
    buf = Buffer(group, nbytes)                       # collective
    active = torch.ones(world, dtype=torch.int32)
    recv_x, recv_count, handle, event, hook = buf.dispatch(
        x, topk_idx, active, T, num_experts, timeout_us=2_000_000, use_fp8=False)
    out = experts(recv_x, recv_count)                 # [local_experts, world*T, hidden]
    y, event, hook = buf.combine(out, topk_idx, topk_weights, active, 2_000_000, handle)

How it moves data: every rank allocates one shared, registered buffer in
its own engine, and the ranks swap (segment name, address, size) through
the group's ``all_gather`` (so any process group works: gloo, or
``mooncake-cpu``). Dispatch writes each token, once per chosen expert,
straight into the owning rank's receive slot for (that expert, this
source); once a destination's data has landed it writes the per-expert
counts' companion flag, the call's sequence number, so a receiver polls
one word per source and then reads everything that source sent. Combine
writes each expert's outputs back into the source's slots the same way,
and the source sums them with the routing weights. Layout and the
alternating halves that keep back-to-back calls apart: _ep_layout.

Rank activeness: ``active_ranks`` (int32, one entry per rank) says who
takes part. Inactive ranks are neither sent to nor waited for; choices of
experts they own are dropped (as choices of -1 are). A source whose flag
has not arrived ``timeout_us`` after this rank started waiting, or a
destination the engine cannot write to, is set to 0 in ``active_ranks`` in
place, and the call completes for the others. ``timeout_us=-1`` waits
forever (no detection). ``update_ep_member`` re-runs the exchange after the
group's membership changed (a replacement rank constructs its Buffer in
the same collective).

Differences from the GPU original: calls are synchronous (``async_finish``
gives an event whose waits return at once), ``return_recv_hook=True`` sends
in the call and receives in ``hook()``, the handle is an opaque object,
fp8 scales are float32 [.., hidden/128] in plain row-major layout, and rows
are sized for fp32, so the size hint is twice DeepEP's bf16 figure.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import time
from typing import List, Optional, Tuple

import torch

from mooncake_go.engine import Op, Request, RequestArray, State, TransferEngine
from mooncake_go.errors import MooncakeError

from . import _ep_layout
from ._ep_layout import FP8_GROUP, FP8_MAX, Layout

_INFO_BYTES = 256  # one rank's (name, address, size) record in the exchange
_DTYPES = (torch.bfloat16, torch.float32)
_YIELD_POLLS = 200  # polls of the flags that yield the core before sleeping on the doorbell
_BELL_NAP = 2e-3  # the longest sleep between polls (a lost ring costs this)


class EventOverlap:
    """DeepEP's event object. On CPU every call has finished its copies
    when it returns, so waiting is immediate."""

    def current_stream_wait(self) -> None:
        """Nothing to wait for on CPU."""

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, *exc) -> None:
        pass


class _Handle:
    """What combine needs from a dispatch: the routing (which token went
    to which expert slot) and the received layout."""

    __slots__ = ("buffer", "epoch", "seq", "num_tokens", "top_k", "hidden", "dtype", "num_experts",
                 "max_tokens", "token", "choice", "expert", "slot", "sent", "counts", "prefix", "recv_count",
                 "done")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


class Buffer:
    """An expert-parallel communication buffer over a process group.

    :param group: the process group (None: the default group). Creation is
        collective: every rank of the group constructs its Buffer.
    :param num_ep_buffer_bytes: size of this rank's buffer; at least
        :meth:`get_ep_buffer_size_hint` of the calls it will serve.
    :param engine: a TransferEngine to use (default: a new one, closed by
        :meth:`destroy`).
    """

    def __init__(self, group=None, num_ep_buffer_bytes: int = 0, *, engine: Optional[TransferEngine] = None):
        import torch.distributed as dist

        if int(num_ep_buffer_bytes) <= 0:
            raise ValueError(f"num_ep_buffer_bytes must be positive, got {num_ep_buffer_bytes}")
        self.group = group
        self.rank = dist.get_rank(group)
        self.num_ranks = dist.get_world_size(group)
        self._own_engine = engine is None
        self._engine = engine if engine is not None else TransferEngine()
        try:
            self._mem = self._engine.allocate_buffer(int(num_ep_buffer_bytes))
        except BaseException:
            if self._own_engine:
                self._engine.close()
            raise
        self._bytes = torch.frombuffer(self._mem.view(), dtype=torch.uint8)
        # The doorbell: a datagram after each flag write wakes a receiver
        # sleeping in select() (the flags stay the truth; a lost ring only
        # costs a re-poll).
        self._bell = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._bell.setblocking(False)
        self._bell.bind((self._engine.name.rsplit(":", 1)[0], 0))
        self._bells: List[Tuple[str, int]] = []
        self._epoch = 0
        self._seq = 0
        self._peers: List[Tuple[int, int, int]] = []  # (segment, address, size) per rank
        self._flags = None
        self._exchange()

    # -- sizing ----------------------------------------------------------

    @staticmethod
    def get_ep_buffer_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                num_experts: int) -> int:
        """The bytes a Buffer needs for calls with these arguments (any of
        fp32, bf16 and fp8)."""
        _check_config(num_ranks, num_experts, num_max_dispatch_tokens_per_rank, hidden)
        return _ep_layout.layout(num_ranks, num_experts, num_max_dispatch_tokens_per_rank, hidden).total

    # -- membership ------------------------------------------------------

    def update_ep_member(self, group=None) -> None:
        """Re-exchanges every rank's buffer after the group's membership
        changed (a rank replaced, rejoined). Collective: the surviving
        ranks call it while a replacement constructs its Buffer. ``group``
        replaces the group (a rebuilt one); None keeps the current one.
        Handles of earlier dispatches become invalid; pass a fresh
        ``active_ranks`` to the next call."""
        import torch.distributed as dist

        if group is not None:
            self.group = group
            self.rank = dist.get_rank(group)
            self.num_ranks = dist.get_world_size(group)
        self._exchange()

    def _exchange(self) -> None:
        """Swaps (segment name, address, size) with every rank. Flags are
        cleared and sequence numbers restart before this rank contributes,
        so once the all_gather returns, every peer has cleared its own and
        no write of the new epoch can be mistaken for an old one."""
        import torch.distributed as dist

        r = self.num_ranks
        if _ep_layout.layout(r, r, 1, 1).staging > self._mem.size:
            raise ValueError(f"num_ep_buffer_bytes {self._mem.size} cannot even hold the flags of {r} ranks")
        self._bytes[: 32 * r].zero_()
        self._flags = (ctypes.c_int64 * (4 * r)).from_address(self._mem.addr)
        self._seq = 0
        self._epoch += 1
        info = json.dumps({"name": self._engine.name, "addr": self._mem.addr, "size": self._mem.size,
                           "bell": list(self._bell.getsockname()[:2])}).encode()
        if len(info) > _INFO_BYTES:
            raise ValueError(f"engine name too long for the exchange: {self._engine.name!r}")
        mine = torch.zeros(_INFO_BYTES, dtype=torch.uint8)
        mine[: len(info)] = torch.frombuffer(bytearray(info), dtype=torch.uint8)
        everyone = [torch.zeros(_INFO_BYTES, dtype=torch.uint8) for _ in range(r)]
        dist.all_gather(everyone, mine, group=self.group)
        peers, bells = [], []
        for i, t in enumerate(everyone):
            raw = bytes(t.tolist()).rstrip(b"\0")
            try:
                d = json.loads(raw)
            except ValueError as e:
                raise RuntimeError(f"rank {i} sent an unreadable EP buffer record: {raw[:80]!r}") from e
            peers.append((self._engine.open_segment(d["name"]), int(d["addr"]), int(d["size"])))
            bells.append((str(d["bell"][0]), int(d["bell"][1])))
        self._peers, self._bells = peers, bells

    # -- dispatch --------------------------------------------------------

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, active_ranks: torch.Tensor,
                 num_max_dispatch_tokens_per_rank: int, num_experts: int, timeout_us: int = -1,
                 use_fp8: bool = True, async_finish: bool = False, return_recv_hook: bool = False):
        """Sends each token of ``x`` [num_tokens, hidden] to the experts
        ``topk_idx`` [num_tokens, top_k] chooses (-1: none).

        Returns ``(recv_x, recv_count, handle, event, hook)``: ``recv_x``
        [local_experts, num_ranks * T, hidden] in x's dtype, or with fp8 a
        pair (float8_e4m3fn data, float32 scales [.., hidden/128]); rows
        of local expert e are ``recv_x[e, :recv_count[e]]``, sources in
        rank order. With ``return_recv_hook`` the tensors are filled when
        ``hook()`` is called, else ``hook`` is None.
        """
        r, me = self.num_ranks, self.rank
        t_max, ne = int(num_max_dispatch_tokens_per_rank), int(num_experts)
        _check_config(r, ne, t_max, x.shape[-1] if x.dim() else 0)
        _check_tokens(x, "x", t_max)
        n, hidden = x.shape
        k = _check_topk(topk_idx, n, ne)
        active = self._check_active(active_ranks)
        lay = self._layout(ne, t_max, hidden)
        if use_fp8:
            fp8 = _fp8_dtype()
            if hidden % FP8_GROUP:
                raise ValueError(f"use_fp8 needs hidden divisible by {FP8_GROUP}, got {hidden}")
            stride = hidden + hidden // FP8_GROUP * 4
        else:
            stride = hidden * x.element_size()
        lx = ne // r
        self._seq += 1
        seq, half = self._seq, self._seq & 1

        # Routing: the kept (token, choice) pairs sorted by expert, then token.
        idx = topk_idx.to(torch.int64)
        tok, choice = (idx >= 0).nonzero(as_tuple=True)
        expert = idx[tok, choice]
        if expert.numel():
            alive = torch.as_tensor(active, dtype=torch.bool)[expert // lx]
            tok, choice, expert = tok[alive], choice[alive], expert[alive]
        order = torch.argsort(expert, stable=True)
        tok, choice, expert = tok[order], choice[order], expert[order]
        sent = torch.bincount(expert, minlength=ne)
        slot = torch.arange(expert.numel()) - (torch.cumsum(sent, 0) - sent)[expert]

        # Pack rows into staging at [expert][slot], so each (rank, expert)
        # is one contiguous write.
        if use_fp8:
            data, scales = _quantize(x, fp8)
            rows = torch.cat([data.view(torch.uint8), scales.view(torch.uint8)], dim=1)
        else:
            rows = x.contiguous().view(torch.uint8)
        word = _word(stride)
        staging = self._bytes[lay.staging: lay.staging + ne * t_max * stride].view(ne, t_max, stride).view(word)
        rows, start = rows.view(word), 0
        for g, c in enumerate(sent.tolist()):
            if c:  # one gather per expert, straight into its slots
                torch.index_select(rows, 0, tok[start: start + c], out=staging[g, :c])
                start += c
        counts_send = self._view(lay.counts_send, torch.int32, r * lx)
        counts_send.copy_(sent.view(-1).to(torch.int32))
        self._view(lay.flag_word, torch.int64, 1)[0] = seq

        base, sent_l = self._mem.addr, sent.tolist()
        jobs = []
        for dst in range(r):
            if not active[dst]:
                continue
            rbase = self._peers[dst][1]
            lo, rem, ln = [], [], []
            for e in range(lx):
                c = sent_l[dst * lx + e]
                if c:
                    lo.append(base + lay.staging + (dst * lx + e) * t_max * stride)
                    rem.append(rbase + lay.dispatch_slot(half, e, me, stride))
                    ln.append(c * stride)
            lo.append(base + lay.counts_send + dst * lx * 4)
            rem.append(rbase + lay.counts_from(half, me))
            ln.append(lx * 4)
            jobs.append((dst, lo, rem, ln, rbase + lay.dispatch_flag(half, me)))
        self._send(jobs, base + lay.flag_word, active_ranks, timeout_us)

        if use_fp8:
            recv_x = (torch.empty(lx, r * t_max, hidden, dtype=fp8),
                      torch.empty(lx, r * t_max, hidden // FP8_GROUP, dtype=torch.float32))
        else:
            recv_x = torch.empty(lx, r * t_max, hidden, dtype=x.dtype)
        recv_count = torch.zeros(lx, dtype=torch.int32)
        handle = _Handle(buffer=self, epoch=self._epoch, seq=seq, num_tokens=n, top_k=k, hidden=hidden,
                         dtype=x.dtype, num_experts=ne, max_tokens=t_max, token=tok, choice=choice,
                         expert=expert, slot=slot, sent=sent, done=False)

        def receive() -> None:
            if handle.done:
                return
            self._wait(lay.dispatch_flags // 8 + half * r, seq, active_ranks, timeout_us)
            got = self._view(lay.counts_from(half, 0), torch.int32, r * lx).view(r, lx).clone()
            got[torch.as_tensor(active_ranks, dtype=torch.int32) == 0] = 0
            counts = got.t().contiguous()  # [local expert, source]
            prefix = torch.cumsum(counts, 1) - counts
            self._unpack(lay, half, counts, prefix, stride, recv_x, hidden)
            recv_count.copy_(counts.sum(1))
            handle.counts, handle.prefix, handle.recv_count = counts, prefix, recv_count.clone()
            handle.done = True

        if return_recv_hook:
            return recv_x, recv_count, handle, EventOverlap(), receive
        receive()
        return recv_x, recv_count, handle, EventOverlap(), None

    def _unpack(self, lay: Layout, half: int, counts: torch.Tensor, prefix: torch.Tensor, stride: int,
                recv_x, hidden: int) -> None:
        """Copies the received rows, [expert][source][slot] in the buffer,
        to recv_x, packed per expert in source order."""
        r, lx, t_max = self.num_ranks, lay.local_experts, lay.num_tokens
        fp8 = isinstance(recv_x, tuple)
        # Whole rows in the widest words their widths allow.
        word = _word(stride, hidden, hidden // FP8_GROUP * 4) if fp8 else _word(stride)
        off = lay.dispatch_recv + half * lay.region
        region = self._bytes[off: off + lx * r * t_max * stride].view(lx, r, t_max, stride).view(word)
        if fp8:
            data, scales = recv_x
            split = hidden // region.element_size()
            outs = [(data.view(torch.uint8).view(word), slice(0, split)),
                    (scales.view(torch.uint8).view(word), slice(split, None))]
        else:
            outs = [(recv_x.view(torch.uint8).view(word), slice(None))]
        for e, (row_counts, row_prefix) in enumerate(zip(counts.tolist(), prefix.tolist())):
            for s, (c, p) in enumerate(zip(row_counts, row_prefix)):
                if c:  # one block copy per (expert, source)
                    for dst, cols in outs:
                        dst[e, p: p + c].copy_(region[e, s, :c, cols])

    # -- combine ---------------------------------------------------------

    def get_next_combine_buffer(self, handle) -> torch.Tensor:
        """A [local_experts, num_ranks * T, hidden] tensor inside the
        registered buffer: write the experts' outputs there and call
        combine with ``zero_copy=True`` to send them without a copy. Valid
        until the next dispatch."""
        h = self._check_handle(handle)
        lay = self._layout(h.num_experts, h.max_tokens, h.hidden)
        lx, n = lay.local_experts, self.num_ranks * h.max_tokens
        return self._view(lay.staging, h.dtype, lx * n * h.hidden).view(lx, n, h.hidden)

    def combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                active_ranks: torch.Tensor, timeout_us: int, handle, zero_copy: bool = False,
                async_finish: bool = False, return_recv_hook: bool = False, out: Optional[torch.Tensor] = None):
        """Sends the experts' outputs ``x`` [local_experts, num_ranks * T,
        hidden] back to the tokens' ranks, which sum them weighted by
        ``topk_weights`` [num_tokens, top_k]. Returns ``(combined_x, event,
        hook)``; combined_x [num_tokens, hidden] in x's dtype (or ``out``).
        Experts of ranks inactive by the end contribute nothing."""
        h = self._check_handle(handle)
        if not h.done:
            raise RuntimeError("combine before the dispatch's receive hook was called")
        r, me = self.num_ranks, self.rank
        lay = self._layout(h.num_experts, h.max_tokens, h.hidden)
        lx, t_max, hidden = lay.local_experts, h.max_tokens, h.hidden
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            raise TypeError("x must be a CPU torch.Tensor")
        if tuple(x.shape) != (lx, r * t_max, hidden):
            raise ValueError(f"x must be [{lx}, {r * t_max}, {hidden}] (local experts, ranks*T, hidden), "
                             f"got {list(x.shape)}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
        if tuple(topk_idx.shape) != (h.num_tokens, h.top_k):
            raise ValueError(f"topk_idx must be the dispatch's [{h.num_tokens}, {h.top_k}], got {list(topk_idx.shape)}")
        if tuple(topk_weights.shape) != (h.num_tokens, h.top_k) or not topk_weights.is_floating_point():
            raise ValueError(f"topk_weights must be a float [{h.num_tokens}, {h.top_k}] tensor, "
                             f"got {topk_weights.dtype} {list(topk_weights.shape)}")
        active = self._check_active(active_ranks)
        stride = hidden * x.element_size()
        seq, half = h.seq, h.seq & 1
        staging = self._view(lay.staging, x.dtype, lx * r * t_max * hidden).view(lx, r * t_max, hidden)
        if zero_copy:
            if x.data_ptr() != staging.data_ptr():
                raise ValueError("zero_copy needs x to be the tensor get_next_combine_buffer returned")
        else:
            for e, c in enumerate(h.recv_count.tolist()):
                if c:
                    staging[e, :c].copy_(x[e, :c])
        self._view(lay.flag_word, torch.int64, 2)[1] = seq

        base, counts, prefix = self._mem.addr, h.counts.tolist(), h.prefix.tolist()
        jobs = []
        for src in range(r):
            if not active[src]:
                continue
            rbase = self._peers[src][1]
            lo, rem, ln = [], [], []
            for e in range(lx):
                c = counts[e][src]
                if c:
                    lo.append(base + lay.staging + (e * r * t_max + prefix[e][src]) * stride)
                    rem.append(rbase + lay.combine_slot(half, me * lx + e, stride))
                    ln.append(c * stride)
            jobs.append((src, lo, rem, ln, rbase + lay.combine_flag(half, me)))
        self._send(jobs, base + lay.flag_word + 8, active_ranks, timeout_us)

        result = out if out is not None else torch.empty(h.num_tokens, hidden, dtype=x.dtype)
        if out is not None and (tuple(out.shape) != (h.num_tokens, hidden) or out.device.type != "cpu"):
            raise ValueError(f"out must be a CPU [{h.num_tokens}, {hidden}] tensor, got {list(out.shape)}")

        def receive() -> None:
            self._wait(lay.combine_flags // 8 + half * r, seq, active_ranks, timeout_us)
            acc = torch.zeros(h.num_tokens, hidden, dtype=torch.float32)
            if h.expert.numel():
                alive = torch.as_tensor(active_ranks, dtype=torch.bool)[h.expert // lx]
                ex, sl, tok, ch = h.expert[alive], h.slot[alive], h.token[alive], h.choice[alive]
                off = lay.combine_recv + half * lay.region
                region = self._view(off, x.dtype, h.num_experts * t_max * hidden).view(-1, hidden)
                # Widen, then scale in place: a mixed-dtype product is
                # many times slower on CPU.
                rows = region.index_select(0, ex * t_max + sl).to(torch.float32)
                rows.mul_(topk_weights[tok, ch].to(torch.float32)[:, None])
                acc.index_add_(0, tok, rows)
            result.copy_(acc)

        if return_recv_hook:
            return result, EventOverlap(), receive
        receive()
        return result, EventOverlap(), None

    # -- transport -------------------------------------------------------

    def _send(self, jobs, flag_local: int, active_ranks: torch.Tensor, timeout_us: int) -> None:
        """Writes every job's data, then, to each destination whose data
        all landed, its flag word. A destination the engine cannot reach
        (or not within the timeout) is marked inactive."""
        wait_s = None if timeout_us < 0 else timeout_us / 1e6
        reqs, owner = [], []
        for dst, lo, rem, ln, _ in jobs:
            seg = self._peers[dst][0]
            reqs += [Request(Op.WRITE, a, seg, b, n) for a, b, n in zip(lo, rem, ln)]
            owner += [dst] * len(lo)
        failed = self._run(reqs, owner, wait_s)
        flags = [(dst, Request(Op.WRITE, flag_local, self._peers[dst][0], flag_remote, 8))
                 for dst, _, _, _, flag_remote in jobs if dst not in failed]
        failed |= self._run([f for _, f in flags], [dst for dst, _ in flags], wait_s)
        for dst in failed:
            active_ranks[dst] = 0
        for dst, _ in flags:
            if dst not in failed:
                try:
                    self._bell.sendto(b"\0", self._bells[dst])
                except OSError:
                    pass  # the flag is written; the receiver re-polls without the ring

    def _run(self, reqs: List[Request], owner: List[int], wait_s: Optional[float]) -> set:
        """Runs reqs as one batch (one submit and one wait for all
        destinations) and returns the owners (destinations) of requests
        that did not complete. A batch the engine refuses as a whole (a
        peer it cannot open) is retried one batch per owner, to tell the
        good destinations from the bad."""
        if not reqs:
            return set()
        eng = self._engine
        b = eng.allocate_batch(len(reqs))
        try:
            eng.submit(b, RequestArray(reqs))
        except MooncakeError:
            self._drop_batch(b)
            owners = list(dict.fromkeys(owner))
            if len(owners) == 1:
                return set(owners)
            failed: set = set()
            for o in owners:
                mine = [r for r, x in zip(reqs, owner) if x == o]
                failed |= self._run(mine, [o] * len(mine), wait_s)
            return failed
        try:
            eng.wait(b, wait_s)
        except MooncakeError:
            failed = set()
            for i, o in enumerate(owner):
                try:
                    done = eng.task_status(b, i).state == State.COMPLETED
                except MooncakeError:
                    done = False
                if not done:
                    failed.add(o)
            self._drop_batch(b)
            return failed or set(owner)
        eng.free_batch(b)
        return set()

    def _drop_batch(self, batch: int) -> None:
        try:
            self._engine.free_batch(batch)
        except MooncakeError:
            pass  # still running: the engine frees it when it closes

    def _wait(self, first_flag: int, seq: int, active_ranks: torch.Tensor, timeout_us: int) -> None:
        """Polls the flag words first_flag.. (one per source) until every
        active source wrote seq; sources still missing at the deadline are
        marked inactive."""
        flags = self._flags
        pending = [s for s in range(self.num_ranks) if active_ranks[s]]
        deadline = None if timeout_us < 0 else time.monotonic() + timeout_us / 1e6
        polls = 0
        while True:
            pending = [s for s in pending if flags[first_flag + s] != seq]
            if not pending:
                return
            if deadline is not None and time.monotonic() >= deadline:
                for s in pending:
                    active_ranks[s] = 0
                return
            # Yield the core for a few polls (peers are often
            # microseconds away), then sleep in the kernel until a peer
            # rings: busy ranks on a small host would otherwise starve the
            # writers they wait for.
            polls += 1
            if polls < _YIELD_POLLS:
                os.sched_yield()
                continue
            nap = _BELL_NAP if deadline is None else max(0.0, min(_BELL_NAP, deadline - time.monotonic()))
            if select.select([self._bell], [], [], nap)[0]:
                try:
                    while self._bell.recv(64):
                        pass
                except OSError:
                    pass  # drained

    # -- checks and views ------------------------------------------------

    def _view(self, offset: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        es = torch.empty((), dtype=dtype).element_size()
        return self._bytes[offset: offset + numel * es].view(dtype)

    def _layout(self, num_experts: int, t_max: int, hidden: int) -> Layout:
        lay = _ep_layout.layout(self.num_ranks, num_experts, t_max, hidden)
        smallest = min(size for _, _, size in self._peers)
        if lay.total > smallest:
            who = "this rank's" if self._mem.size < lay.total else "a peer's"
            raise ValueError(f"EP buffer too small: {lay.total} bytes needed for T={t_max}, hidden={hidden}, "
                             f"{self.num_ranks} ranks, {num_experts} experts; {who} buffer has {smallest} "
                             "(see Buffer.get_ep_buffer_size_hint)")
        return lay

    def _check_active(self, active_ranks) -> List[int]:
        if not isinstance(active_ranks, torch.Tensor) or active_ranks.dtype != torch.int32 \
                or tuple(active_ranks.shape) != (self.num_ranks,) or active_ranks.device.type != "cpu":
            raise ValueError(f"active_ranks must be a CPU int32 tensor of shape [{self.num_ranks}]")
        return active_ranks.tolist()

    def _check_handle(self, handle) -> _Handle:
        if not isinstance(handle, _Handle) or handle.buffer is not self:
            raise ValueError("handle must come from this buffer's dispatch")
        if handle.epoch != self._epoch:
            raise ValueError("handle predates update_ep_member; dispatch again")
        return handle

    # -- lifecycle -------------------------------------------------------

    def destroy(self) -> None:
        """Frees the buffer (and the engine this Buffer created). Local, idempotent."""
        if self._mem is not None:
            self._bytes = None
            self._flags = None
            self._mem.free()
            self._mem = None
            self._bell.close()
            if self._own_engine:
                self._engine.close()

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()


def _word(*widths: int) -> torch.dtype:
    """The widest integer dtype whose size divides every byte width."""
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if all(w % size == 0 for w in widths):
            return dtype
    return torch.uint8


def _check_config(num_ranks: int, num_experts: int, t_max: int, hidden: int) -> None:
    if num_ranks <= 0:
        raise ValueError(f"num_ranks must be positive, got {num_ranks}")
    if num_experts <= 0 or num_experts % num_ranks:
        raise ValueError(f"num_experts ({num_experts}) must be a positive multiple of the number of ranks "
                         f"({num_ranks})")
    if t_max <= 0:
        raise ValueError(f"num_max_dispatch_tokens_per_rank must be positive, got {t_max}")
    if hidden <= 0:
        raise ValueError(f"hidden must be positive, got {hidden}")


def _check_tokens(x, name: str, t_max: int) -> None:
    if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
        raise TypeError(f"{name} must be a CPU torch.Tensor")
    if x.dim() != 2:
        raise ValueError(f"{name} must be [num_tokens, hidden], got shape {list(x.shape)}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{name} must be bfloat16 or float32, got {x.dtype}")
    if x.shape[0] > t_max:
        raise ValueError(f"{name} has {x.shape[0]} tokens, more than num_max_dispatch_tokens_per_rank={t_max}")


def _check_topk(topk_idx, n: int, num_experts: int) -> int:
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.shape[0] != n:
        raise ValueError(f"topk_idx must be a [num_tokens={n}, top_k] tensor, got "
                         f"{list(topk_idx.shape) if isinstance(topk_idx, torch.Tensor) else type(topk_idx)}")
    if topk_idx.is_floating_point() or topk_idx.is_complex() or topk_idx.dtype == torch.bool:
        raise TypeError(f"topk_idx must be an integer tensor, got {topk_idx.dtype}")
    if topk_idx.numel():
        lo, hi = int(topk_idx.min()), int(topk_idx.max())
        if lo < -1 or hi >= num_experts:
            raise ValueError(f"topk_idx values must be -1 or in [0, {num_experts}), got [{lo}, {hi}]")
    return topk_idx.shape[1]


def _fp8_dtype() -> torch.dtype:
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        raise RuntimeError(f"use_fp8=True needs torch.float8_e4m3fn, which torch {torch.__version__} lacks; "
                           "pass use_fp8=False")
    return fp8


def _quantize(x: torch.Tensor, fp8: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-128-channel fp8: data * scale recovers x."""
    n, hidden = x.shape
    g = x.to(torch.float32).view(n, hidden // FP8_GROUP, FP8_GROUP)
    scales = g.abs().amax(dim=-1).clamp(min=1e-10) / FP8_MAX
    data = (g / scales[..., None]).to(fp8).view(n, hidden)
    return data.contiguous(), scales.contiguous()


def per_token_cast_back(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Dequantizes dispatch's fp8 ``(data, scales)`` to float32 (a helper
    for experts that compute in higher precision)."""
    shape = data.shape
    g = data.to(torch.float32).view(*shape[:-1], shape[-1] // FP8_GROUP, FP8_GROUP)
    return (g * scales[..., None]).view(shape)


__all__ = ["Buffer", "EventOverlap", "per_token_cast_back"]
