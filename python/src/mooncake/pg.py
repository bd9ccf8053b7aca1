"""mooncake.pg: Mooncake PG on mooncake-go, a fault-tolerant
``torch.distributed`` backend whose data moves through our Transfer Engine
(shared memory on one host, TCP across hosts), for CPU tensors.

Importing the module registers the backends ``mooncake-cpu`` and
``mooncake`` (the same backend; this build serves CPU tensors only)::

    from mooncake import pg
    dist.init_process_group("mooncake-cpu", rank=r, world_size=n,
                            pg_options=pg.MooncakeBackendOptions(n))

Only active ranks take part in collectives; inactive ranks are skipped
(their entries of gathered outputs are left as they were). A rank that
dies is found (its process gone on this host, a failed write, or silence
for the timeout) and deactivated on every survivor; the collective in
flight finishes over the survivors. A replacement starts with
``is_extension=True``, calls :func:`join_group`, and joins once a healthy
rank calls :func:`recover_ranks`. docs/mooncake-pg.md has the details.
"""

from __future__ import annotations

import os
import queue
import threading
from datetime import timedelta
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from mooncake_go.engine import TransferEngine
from mooncake_go.errors import MooncakeError

from ._pg_comm import REGISTER_MIN, Comm, PeerFailure

__all__ = ["MooncakeBackendOptions", "MooncakeProcessGroup", "PeerFailure", "activate_ranks", "deactivate_ranks",
           "get_active_ranks", "get_num_synced_ranks", "get_peer_state", "join_group", "recover_ranks",
           "set_device_filter", "set_host_ip", "set_transfer_engine", "sync_after_failure"]

BACKEND = "mooncake-cpu"
DEFAULT_TIMEOUT = 30.0

_engine: Optional[TransferEngine] = None
_engine_lock = threading.Lock()
_host_ip: Optional[str] = None
_device_filter: List[str] = []


def set_host_ip(ip: str) -> None:
    """The address peers reach this process's engine at (before init)."""
    global _host_ip
    _host_ip = ip


def set_device_filter(devices: Sequence[str]) -> None:
    """Kept for the official API: the NICs an RDMA engine may use. The CPU
    backend moves data over shared memory and TCP, so it is recorded only."""
    _device_filter[:] = list(devices)


def set_transfer_engine(engine) -> None:
    """Use this engine (mooncake_go.TransferEngine, or an object with a
    ``native``/``engine`` attribute holding one) instead of making one."""
    global _engine
    for attr in ("native", "engine", "_engine"):
        inner = getattr(engine, attr, None)
        if isinstance(inner, TransferEngine):
            engine = inner
            break
    if not isinstance(engine, TransferEngine):
        raise TypeError(f"mooncake.pg: set_transfer_engine needs a mooncake_go TransferEngine, not {type(engine)}")
    _engine = engine


def _get_engine() -> TransferEngine:
    global _engine
    with _engine_lock:
        if _engine is None or _engine.closed:
            _engine = TransferEngine(host=_host_ip or os.environ.get("MC_TCP_BIND_ADDRESS") or None)
        return _engine


class MooncakeBackendOptions:
    """``MooncakeBackendOptions(max_group_size[, is_extension[,
    auto_deactivate_on_failure, auto_sync_on_failure]])``; the first
    argument may instead be an int32 ``active_ranks`` tensor (1 = active),
    sized to max_group_size, which the backend keeps as a mirror of the
    committed membership. ``timeout`` (seconds; MOONCAKE_PG_TIMEOUT, else
    30) bounds how long a silent peer is waited for."""

    def __init__(self, max_group_size=None, is_extension: bool = False, auto_deactivate_on_failure: bool = True,
                 auto_sync_on_failure: bool = True, timeout: Optional[float] = None):
        self.active_ranks: Optional[torch.Tensor] = None
        if isinstance(max_group_size, torch.Tensor):
            if max_group_size.dtype != torch.int32 or max_group_size.dim() != 1:
                raise TypeError("MooncakeBackendOptions: active_ranks must be a 1-D int32 tensor")
            self.active_ranks = max_group_size
            max_group_size = max_group_size.numel()
        if max_group_size is not None and int(max_group_size) < 1:
            raise ValueError(f"MooncakeBackendOptions: max_group_size must be positive, not {max_group_size}")
        if auto_sync_on_failure and not auto_deactivate_on_failure:
            raise ValueError("MooncakeBackendOptions: auto_sync_on_failure requires auto_deactivate_on_failure")
        self.max_group_size = None if max_group_size is None else int(max_group_size)
        self.is_extension = bool(is_extension)
        self.auto_deactivate_on_failure = bool(auto_deactivate_on_failure)
        self.auto_sync_on_failure = bool(auto_sync_on_failure)
        self.timeout = timeout


def _op_code(op) -> int:
    R = dist.ReduceOp
    for code, known in enumerate((R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR), 1):
        if op == known:
            return code
    raise ValueError(f"mooncake-cpu: unsupported reduce op {op}")


_DTYPES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3, torch.int32: 4, torch.int64: 5,
           torch.float64: 6, torch.uint8: 7, torch.int8: 8, torch.int16: 9, torch.bool: 10}
_NAMES = {1: "all_reduce", 2: "broadcast", 3: "all_gather", 4: "reduce_scatter", 5: "all_to_all", 6: "barrier",
          7: "reduce", 8: "gather", 9: "scatter"}
_OPNAMES = {0: "-", 1: "SUM", 2: "AVG", 3: "PRODUCT", 4: "MIN", 5: "MAX", 6: "BAND", 7: "BOR", 8: "BXOR"}


def _dtype_code(t: torch.Tensor) -> int:
    if t.device.type != "cpu":
        raise ValueError(f"mooncake-cpu: tensors must be on the CPU, not {t.device}")
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise TypeError(f"mooncake-cpu: unsupported dtype {t.dtype}")
    return code


def _combine(acc: torch.Tensor, x: torch.Tensor, code: int) -> None:
    if code in (1, 2):
        acc.add_(x)
    elif code == 3:
        acc.mul_(x)
    elif code == 4:
        torch.minimum(acc, x, out=acc)
    elif code == 5:
        torch.maximum(acc, x, out=acc)
    elif code == 6:
        acc.bitwise_and_(x)
    elif code == 7:
        acc.bitwise_or_(x)
    else:
        acc.bitwise_xor_(x)


def _check_op(t: torch.Tensor, code: int) -> None:
    fp = t.dtype.is_floating_point
    if code == 2 and not fp:
        raise ValueError(f"mooncake-cpu: ReduceOp.AVG needs a floating-point tensor, not {t.dtype}")
    if code >= 6 and fp:
        raise ValueError(f"mooncake-cpu: bitwise reduce ops need integer tensors, not {t.dtype}")
    if t.dtype == torch.bool and code not in (4, 5, 6, 7, 8):
        raise ValueError("mooncake-cpu: bool tensors reduce with MIN, MAX or bitwise ops only")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


#: all_reduce up to this size (and a slot) is one piece: with every peer
#: mapped, one step and a reduction of the ranks' slots read in place
#: (4 x the data read per rank, but one synchronisation instead of two,
#: which on a host the ranks oversubscribe costs more up to a few MiB);
#: through the engine, direct up to 256 KiB, else reduce-scatter +
#: all-gather.
ONE_PIECE_MAX = 4 << 20


class _Work(dist.Work):
    """A Work over a future: wait() raises what the operation raised (the
    Work torch makes from a future swallows it)."""

    def __init__(self, fut: torch.futures.Future):
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None) -> bool:
        self._fut.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.wait()
            return True
        except Exception:  # noqa: BLE001
            return False


def _create_work_from_future(fut) -> _Work:
    return _Work(fut)


class _Source:
    """Local registered memory holding a flat uint8 tensor's bytes, asked
    for range by range (``at``): copied into the stage ring as each piece
    needs them, or, for sources of REGISTER_MIN bytes and more (and where
    the stage is too small for a piece: very large groups), the tensor
    itself registered for the call."""

    def __init__(self, comm: Comm, flat: torch.Tensor):
        self.comm, self.flat = comm, flat
        self.reg = None
        n = flat.numel()
        # With every peer mapped, copies read the tensor itself: nothing
        # to register unless the view later takes in an unmapped peer
        # (then the stage ring serves it).
        if n and (not comm.stage_cap or (n >= REGISTER_MIN and not comm.all_mapped())):
            try:
                self.reg = comm.eng.register_memory(flat.data_ptr(), n, remote_accessible=False)
            except MooncakeError:
                self.flat = flat.clone()  # overlaps registered memory: use a copy
                self.reg = comm.eng.register_memory(self.flat.data_ptr(), n, remote_accessible=False)

    def at(self, off: int, n: int) -> int:
        """The address of bytes [off, off+n) in registered memory. A piece
        asks for at most (max_group_size - 1) slots, so the ring never
        overwrites what the same piece still has to send."""
        c = self.comm
        if self.reg is not None:
            return self.reg + off
        if c.all_mapped():
            # Every peer's slot is mapped here: the copy into it reads the
            # tensor itself, no stage copy first.
            return self.flat.data_ptr() + off
        if c.src_cur + n > c.stage_cap:
            c.src_cur = 0
        o = c.src_off + c.src_cur
        c.sbuf[o:o + n].copy_(self.flat[off:off + n])
        c.src_cur += (n + 63) // 64 * 64
        return c.stage.addr + o

    def to(self, peers, off: int, n: int, dst: int) -> List[tuple]:
        """The same bytes to each of peers, at dst in their slots."""
        if not peers or not n:
            return []
        a = self.at(off, n)
        return [(p, a, n, dst) for p in peers]

    def close(self) -> None:
        if self.reg is not None:
            reg, self.reg = self.reg, None
            self.comm.eng.unregister_memory(reg)


class MooncakeProcessGroup(dist.ProcessGroup):
    """The ``mooncake-cpu`` process group (made by init_process_group /
    new_group). Collective entry points follow torch's ProcessGroup
    methods."""

    def __init__(self, store, rank: int, size: int, timeout: Optional[timedelta] = None,
                 options: Optional[MooncakeBackendOptions] = None):
        super().__init__(rank, size)
        opts = options or MooncakeBackendOptions()
        G = opts.max_group_size or size
        if G < size:
            raise ValueError(f"mooncake-cpu: max_group_size {G} is smaller than the world size {size}")
        self._opts = opts
        if opts.active_ranks is not None:
            initial = [r for r in range(size) if int(opts.active_ranks[r]) != 0]
            self._mirror = opts.active_ranks
        else:
            initial = list(range(size))
            self._mirror = torch.zeros(G, dtype=torch.int32)
        t = opts.timeout or float(os.environ.get("MOONCAKE_PG_TIMEOUT", 0) or 0) or DEFAULT_TIMEOUT
        self._comm = Comm(_get_engine(), store, rank, size, G, initial, opts.is_extension,
                          opts.auto_deactivate_on_failure, opts.auto_sync_on_failure, t, on_view=self._on_view)
        self._on_view(self._comm.active)
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._worker: Optional[threading.Thread] = None
        self._inflight = 0
        self._cv = threading.Condition()

    # -- identity --------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    @property
    def name(self) -> str:  # type: ignore[override]
        return BACKEND

    def _on_view(self, active: List[int]) -> None:
        self._mirror.zero_()
        for r in active:
            if r < self._mirror.numel():
                self._mirror[r] = 1

    # -- running work ----------------------------------------------------

    def _run(self, fn, result, opts=None):
        """Runs fn now (blocking calls) or on the group's worker thread
        (async_op=True), in call order either way; returns a Work."""
        fut = torch.futures.Future()
        if opts is None or not getattr(opts, "asyncOp", True):
            self._drain()
            try:
                self._comm.run(fn)
                fut.set_result(result)
            except Exception as e:  # noqa: BLE001 - the Work raises it
                fut.set_exception(e)
            return _create_work_from_future(fut)
        with self._cv:
            self._inflight += 1
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name="mooncake-pg", daemon=True)
            self._worker.start()
        self._queue.put((fn, result, fut))
        return _create_work_from_future(fut)

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, result, fut = item
            try:
                self._comm.run(fn)
                fut.set_result(result)
            except Exception as e:  # noqa: BLE001
                fut.set_exception(e)
            with self._cv:
                self._inflight -= 1
                self._cv.notify_all()

    def _drain(self) -> None:
        with self._cv:
            while self._inflight:
                self._cv.wait()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._drain()
            self._queue.put(None)
            self._worker.join(timeout=5)
            self._worker = None
        self._comm.close()

    def abort(self) -> None:
        self.shutdown()

    # -- pieces ----------------------------------------------------------

    def _others(self) -> List[int]:
        c = self._comm
        return [p for p in c.active if p != c.rank]

    def _check_headers(self, par: int, sig, kind: int) -> None:
        c = self._comm
        for p in self._others():
            h = c.peer_header(par, p)
            if h[0] == 0x4D43504731 and tuple(h[1:6]) == tuple(sig) and h[6] == c.piece:
                continue
            raise ValueError(f"mooncake-cpu: {_NAMES.get(kind, '?')} mismatch: rank {c.rank} called "
                             f"{self._describe(sig)}, rank {p} called {self._describe(h[1:6])}"
                             + ("" if h[6] == c.piece else f" (piece {h[6]} vs {c.piece})"))

    @staticmethod
    def _describe(sig) -> str:
        dt = {v: k for k, v in _DTYPES.items()}.get(sig[1], "?")
        return (f"{_NAMES.get(sig[0], '?')}(dtype={dt}, numel={sig[2]}, op={_OPNAMES.get(sig[3], '?')}, "
                f"root={sig[4]})")

    def _hdr_writes(self, sig, sends=(), expects=()) -> List[tuple]:
        c = self._comm
        a = c.header(sig, c.piece, sends, expects)
        return [(p, a, c.H, 0) for p in self._others()]

    def _slot(self, par: int, p: int, n: int) -> torch.Tensor:
        c = self._comm
        o = c.slot_off(par, p) + c.H
        return c.dbuf[o:o + n]

    # -- collectives -----------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if opts is None:
            opts = dist.AllreduceOptions()
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            raise ValueError("mooncake-cpu: allreduce takes one tensor per process")
        t = tensors[0]
        code = _op_code(opts.reduceOp)
        _check_op(t, code)
        sig = (1, _dtype_code(t), t.numel(), code, 0)
        return self._run(lambda: self._allreduce(t, code, sig), tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        works = [self.allreduce([t], opts) for t in tensors]
        for w in works[:-1]:
            w.wait()
        return works[-1]

    def _allreduce(self, t: torch.Tensor, code: int, sig) -> None:
        c = self._comm
        work = t if t.is_contiguous() else t.contiguous()
        flat = work.reshape(-1)
        E, es = flat.numel(), flat.element_size()
        src = _Source(c, _bytes(flat))
        try:
            if E * es <= min(c.P, ONE_PIECE_MAX):
                c.do_piece(lambda: self._ar_one(flat, src, code, sig))
            else:
                done = 0
                while done < E:
                    done += c.do_piece(lambda: self._ar_piece(flat, src, done, code, sig))
        finally:
            src.close()
        if work is not t:
            t.copy_(work)

    def _reduce_into(self, acc: torch.Tensor, parts, code: int) -> None:
        """acc = parts[0] op parts[1] op ... in rank order (the same on every rank)."""
        acc.copy_(parts[0])
        for x in parts[1:]:
            _combine(acc, x, code)
        if code == 2:
            acc.div_(len(parts))

    def _ar_direct(self, flat, src, code, sig):
        c = self._comm
        n = flat.numel() * flat.element_size()
        writes = self._hdr_writes(sig)
        if n:
            writes += src.to(self._others(), 0, n, c.H)
        par = c.exchange(writes)
        self._check_headers(par, sig, 1)
        if len(c.active) == 1:
            if code == 2:
                flat.div_(1)
            return 0
        parts = [flat if p == c.rank else self._slot(par, p, n).view(flat.dtype) for p in c.active]
        acc = c.sbuf[c.red_off:c.red_off + n].view(flat.dtype)
        self._reduce_into(acc, parts, code)
        flat.copy_(acc)
        return 0

    def _ar_one(self, flat, src, code, sig):
        """An all_reduce that fits one piece: in place from mapped peers;
        else direct (small) or reduce-scatter + all-gather in one piece."""
        c = self._comm
        n = flat.numel() * flat.element_size()
        if c.all_mapped():
            return self._ar_pull(flat, code, sig)
        if n <= min(c.P, 256 << 10):
            return self._ar_direct(flat, src, code, sig)
        return self._ar_piece(flat, src, 0, code, sig)

    def _ar_pull(self, flat, code, sig):
        """One step with every peer mapped: each rank publishes its tensor
        in its own slot, and after the step reduces the ranks' slots, read
        in place, straight into its tensor (one synchronisation, no copies
        to peers)."""
        c = self._comm
        n = flat.numel() * flat.element_size()
        par = (c.step + 1) & 1
        if n:
            c.own_slot(par, c.rank, n).copy_(_bytes(flat))
        if c.exchange(self._hdr_writes(sig)) != par:
            raise RuntimeError("mooncake-cpu: step parity moved during all_reduce")
        self._check_headers(par, sig, 1)
        act = c.active
        if len(act) == 1:
            return 0
        if n:
            parts = [c.own_slot(par, p, n).view(flat.dtype) for p in act]
            if code in (1, 2):
                torch.add(parts[0], parts[1], out=flat)
                for x in parts[2:]:
                    flat.add_(x)
                if code == 2:
                    flat.div_(len(parts))
            else:
                self._reduce_into(flat, parts, code)
        return 0

    def _ar_piece(self, flat, src, done, code, sig):
        """One reduce-scatter + all-gather piece over elements [done, done+len)."""
        c = self._comm
        E, es = flat.numel(), flat.element_size()
        act = c.active
        n = len(act)
        q = min(-(-(E - done) // n), c.P // es)
        ln = min(E - done, n * q)
        me = act.index(c.rank)

        def chunk(j):
            a = min(j * q, ln)
            return done + a, min(a + q, ln) - a

        writes = self._hdr_writes(sig)
        for j, p in enumerate(act):
            a, k = chunk(j)
            if p != c.rank and k:
                writes.append((p, src.at(a * es, k * es), k * es, c.H))
        par = c.exchange(writes)
        self._check_headers(par, sig, 1)
        a0, k0 = chunk(me)
        acc = c.sbuf[c.red_off:c.red_off + k0 * es].view(flat.dtype)
        parts = [flat[a0:a0 + k0] if p == c.rank else self._slot(par, p, k0 * es).view(flat.dtype) for p in act]
        self._reduce_into(acc, parts, code)
        red = c.stage.addr + c.red_off
        writes = self._hdr_writes(sig)
        if k0:
            writes += [(p, red, k0 * es, c.H) for p in self._others()]
        par = c.exchange(writes)
        self._check_headers(par, sig, 1)
        for j, p in enumerate(act):
            a, k = chunk(j)
            if k:
                flat[a:a + k].copy_(acc if p == c.rank else self._slot(par, p, k * es).view(flat.dtype))
        return ln

    def broadcast(self, tensors, opts=None):
        if opts is None:
            opts = dist.BroadcastOptions()
        t = tensors[0]
        root = opts.rootRank
        sig = (2, _dtype_code(t), t.numel(), 0, root)

        def body():
            c = self._comm
            if root not in c.active:
                raise PeerFailure(f"mooncake-cpu: broadcast root {root} is not active", [root])
            work = t if t.is_contiguous() else t.contiguous()
            b = _bytes(work)
            src = _Source(c, b) if c.rank == root else None
            try:
                self._pieces(b.numel(), sig, lambda off, n, par: None if c.rank == root else
                             b[off:off + n].copy_(self._slot(par, root, n)),
                             lambda off, n: src.to(self._others(), off, n, c.H) if c.rank == root else [])
            finally:
                if src:
                    src.close()
            if work is not t:
                t.copy_(work)
        return self._run(body, tensors, opts)

    def _pieces(self, total: int, sig, recv, send) -> None:
        """Moves total bytes in pieces of at most P: send(off, n) gives the
        payload writes of a piece, recv(off, n, parity) consumes it."""
        c = self._comm
        off = 0
        while True:
            n = min(c.P, total - off)

            def piece(off=off, n=n):
                writes = self._hdr_writes(sig) + (send(off, n) if n else [])
                par = c.exchange(writes)
                self._check_headers(par, sig, sig[0])
                if n:
                    recv(off, n, par)
            c.do_piece(piece)
            off += n
            if off >= total:
                return

    def allgather(self, output_lists, inputs, opts=None):
        outs, t = output_lists[0], inputs[0]
        if len(outs) != self.size():
            raise ValueError(f"mooncake-cpu: all_gather needs {self.size()} output tensors, got {len(outs)}")
        for o in outs:
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError(f"mooncake-cpu: all_gather output {tuple(o.shape)} {o.dtype} does not match "
                                 f"the input {tuple(t.shape)} {t.dtype}")
        return self._run(lambda: self._allgather(outs, t), output_lists, opts)

    def _allgather_base(self, output, input, opts=None):
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(f"mooncake-cpu: all_gather_into_tensor output {tuple(output.shape)} {output.dtype} "
                             f"must hold {self.size()} x input {tuple(input.shape)} {input.dtype}")
        if not output.is_contiguous():
            raise ValueError("mooncake-cpu: all_gather_into_tensor needs a contiguous output")
        outs = list(output.reshape(-1).chunk(self.size())) if input.numel() else [output] * self.size()
        return self._run(lambda: self._allgather(outs, input), [output], opts)

    all_gather_single = _allgather_base

    def _allgather(self, outs, t) -> None:
        c = self._comm
        sig = (3, _dtype_code(t), t.numel(), 0, 0)
        work = t if t.is_contiguous() else t.contiguous()
        b = _bytes(work)
        tmp = {i: o for i, o in enumerate(outs) if not o.is_contiguous()}
        dst = [_bytes(o.contiguous() if i in tmp else o) for i, o in enumerate(outs)]
        src = _Source(c, b)
        try:
            def recv(off, n, par):
                for p in self._others():
                    dst[p][off:off + n].copy_(self._slot(par, p, n))
            self._pieces(b.numel(), sig, recv,
                         lambda off, n: src.to(self._others(), off, n, c.H))
        finally:
            src.close()
        if b.numel():
            dst[c.rank].copy_(src.flat)
        for i, o in tmp.items():
            o.copy_(dst[i].view(o.dtype).view(o.shape))

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        works = [self.allgather([o], [i], opts) for o, i in zip(output_lists, inputs)]
        for w in works[:-1]:
            w.wait()
        return works[-1]

    def barrier(self, opts=None):
        sig = (6, 0, 0, 0, 0)
        return self._run(lambda: self._pieces(0, sig, None, None), [], opts)

    def reduce(self, tensors, opts=None):
        if opts is None:
            opts = dist.ReduceOptions()
        t, root = tensors[0], opts.rootRank
        code = _op_code(opts.reduceOp)
        _check_op(t, code)
        sig = (7, _dtype_code(t), t.numel(), code, root)

        def body():
            c = self._comm
            if root not in c.active:
                raise PeerFailure(f"mooncake-cpu: reduce root {root} is not active", [root])
            work = t if t.is_contiguous() else t.contiguous()
            b = _bytes(work)
            es = work.element_size()
            src = _Source(c, b)

            def recv(off, n, par):
                if c.rank != root:
                    return
                acc = c.sbuf[c.red_off:c.red_off + n].view(work.dtype)
                parts = [b[off:off + n].view(work.dtype) if p == c.rank else self._slot(par, p, n).view(work.dtype)
                         for p in c.active]
                self._reduce_into(acc, parts, code)
                b[off:off + n].copy_(c.sbuf[c.red_off:c.red_off + n])
            try:
                P = c.P // es * es
                off = 0
                while True:
                    n = min(P, b.numel() - off)

                    def piece(off=off, n=n):
                        w = self._hdr_writes(sig)
                        if c.rank != root and n:
                            w.append((root, src.at(off, n), n, c.H))
                        par = c.exchange(w)
                        self._check_headers(par, sig, 7)
                        if n:
                            recv(off, n, par)
                    c.do_piece(piece)
                    off += n
                    if off >= b.numel():
                        break
            finally:
                src.close()
            if work is not t and c.rank == root:
                t.copy_(work)
        return self._run(body, tensors, opts)

    def gather(self, output_lists, inputs, opts=None):
        if opts is None:
            opts = dist.GatherOptions()
        t, root = inputs[0], opts.rootRank
        outs = output_lists[0] if output_lists else []
        if self.rank() == root:
            if len(outs) != self.size():
                raise ValueError(f"mooncake-cpu: gather needs {self.size()} output tensors at the root")
            for o in outs:
                if o.numel() != t.numel() or o.dtype != t.dtype or not o.is_contiguous():
                    raise ValueError("mooncake-cpu: gather outputs must be contiguous and match the input")
        sig = (8, _dtype_code(t), t.numel(), 0, root)

        def body():
            c = self._comm
            if root not in c.active:
                raise PeerFailure(f"mooncake-cpu: gather root {root} is not active", [root])
            b = _bytes(t.contiguous())
            src = _Source(c, b)

            def recv(off, n, par):
                if c.rank == root:
                    for p in self._others():
                        _bytes(outs[p])[off:off + n].copy_(self._slot(par, p, n))
            try:
                self._pieces(b.numel(), sig, recv,
                             lambda off, n: [] if c.rank == root else [(root, src.at(off, n), n, c.H)])
            finally:
                src.close()
            if c.rank == root and b.numel():
                _bytes(outs[root]).copy_(b)
        return self._run(body, output_lists, opts)

    def scatter(self, outputs, input_lists, opts=None):
        if opts is None:
            opts = dist.ScatterOptions()
        t, root = outputs[0], opts.rootRank
        ins = input_lists[0] if input_lists else []
        if not t.is_contiguous():
            raise ValueError("mooncake-cpu: scatter needs a contiguous output")
        if self.rank() == root:
            if len(ins) != self.size():
                raise ValueError(f"mooncake-cpu: scatter needs {self.size()} input tensors at the root")
            for i in ins:
                if i.numel() != t.numel() or i.dtype != t.dtype:
                    raise ValueError("mooncake-cpu: scatter inputs must match the output")
        sig = (9, _dtype_code(t), t.numel(), 0, root)

        def body():
            c = self._comm
            if root not in c.active:
                raise PeerFailure(f"mooncake-cpu: scatter root {root} is not active", [root])
            b = _bytes(t)
            flat = torch.cat([_bytes(i.contiguous()) for i in ins]) if c.rank == root else None
            src = _Source(c, flat) if flat is not None else None
            nb = b.numel()
            try:
                self._pieces(nb, sig, lambda off, n, par: None if c.rank == root else
                             b[off:off + n].copy_(self._slot(par, root, n)),
                             lambda off, n: [(p, src.at(p * nb + off, n), n, c.H) for p in self._others()]
                             if c.rank == root else [])
            finally:
                if src:
                    src.close()
            if c.rank == root and nb:
                b.copy_(flat[root * nb:(root + 1) * nb])
        return self._run(body, outputs, opts)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        t, ins = outputs[0], input_lists[0]
        if len(ins) != self.size():
            raise ValueError(f"mooncake-cpu: reduce_scatter needs {self.size()} inputs, got {len(ins)}")
        for i in ins:
            if i.numel() != t.numel() or i.dtype != t.dtype:
                raise ValueError(f"mooncake-cpu: reduce_scatter input {tuple(i.shape)} {i.dtype} does not match "
                                 f"the output {tuple(t.shape)} {t.dtype}")
        flat = torch.cat([i.reshape(-1) for i in ins]) if t.numel() else t.new_empty(0)
        return self._reduce_scatter(t, flat, opts, outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        if input.numel() != output.numel() * self.size() or input.dtype != output.dtype:
            raise ValueError(f"mooncake-cpu: reduce_scatter_tensor input {tuple(input.shape)} {input.dtype} must "
                             f"hold {self.size()} x output {tuple(output.shape)} {output.dtype}")
        return self._reduce_scatter(output, input.reshape(-1) if input.is_contiguous() else
                                    input.contiguous().reshape(-1), opts, [output])

    reduce_scatter_single = _reduce_scatter_base

    def _reduce_scatter(self, out, flat, opts, result):
        if opts is None:
            opts = dist.ReduceScatterOptions()
        code = _op_code(opts.reduceOp)
        _check_op(out, code)
        sig = (4, _dtype_code(out), out.numel(), code, 0)
        M, es = out.numel(), out.element_size()

        def body():
            c = self._comm
            work = out if out.is_contiguous() else out.contiguous()
            res = work.reshape(-1)
            src = _Source(c, _bytes(flat))
            try:
                P = c.P // es
                done = 0
                while True:
                    n = min(P, M - done)

                    def piece(done=done, n=n):
                        w = self._hdr_writes(sig)
                        if n:
                            w += [(p, src.at((p * M + done) * es, n * es), n * es, c.H) for p in self._others()]
                        par = c.exchange(w)
                        self._check_headers(par, sig, 4)
                        if n:
                            mine = flat[c.rank * M + done:c.rank * M + done + n]
                            parts = [mine if p == c.rank else self._slot(par, p, n * es).view(out.dtype)
                                     for p in c.active]
                            acc = c.sbuf[c.red_off:c.red_off + n * es].view(out.dtype)
                            self._reduce_into(acc, parts, code)
                            res[done:done + n].copy_(acc)
                    c.do_piece(piece)
                    done += n
                    if done >= M:
                        break
            finally:
                src.close()
            if work is not out:
                out.copy_(work)
        return self._run(body, result, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        W = self.size()
        if output.dtype != input.dtype:
            raise ValueError(f"mooncake-cpu: all_to_all dtypes differ: output {output.dtype}, input {input.dtype}")
        if not (output.is_contiguous() and input.is_contiguous()):
            raise ValueError("mooncake-cpu: all_to_all needs contiguous tensors")
        rows_in, rows_out = (input.size(0) if input.dim() else 1), (output.size(0) if output.dim() else 1)
        row = input.numel() // rows_in * input.element_size() if rows_in else 0
        orow = output.numel() // rows_out * output.element_size() if rows_out else 0
        ins = list(input_split_sizes) or ([rows_in // W] * W if rows_in % W == 0 else None)
        outs = list(output_split_sizes) or ([rows_out // W] * W if rows_out % W == 0 else None)
        if ins is None or outs is None or len(ins) != W or len(outs) != W:
            raise ValueError(f"mooncake-cpu: all_to_all splits must name {W} ranks (or the first dimension "
                             f"must divide by {W})")
        if sum(ins) != rows_in or sum(outs) != rows_out:
            raise ValueError(f"mooncake-cpu: all_to_all splits {ins} / {outs} do not add up to the tensors' "
                             f"first dimensions {rows_in} / {rows_out}")
        if ins and outs and row != orow and rows_in and rows_out:
            raise ValueError("mooncake-cpu: all_to_all input and output rows differ in size")
        ib, ob = _bytes(input), _bytes(output)
        sends = [s * row for s in ins]
        recvs = [s * (orow or row) for s in outs]
        return self._run(lambda: self._alltoall(ib, ob, sends, recvs, _dtype_code(input)), [output], opts)

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        W = self.size()
        if len(output_tensors) != W or len(input_tensors) != W:
            raise ValueError(f"mooncake-cpu: all_to_all needs {W} input and output tensors")
        dt = input_tensors[0].dtype
        for x in list(input_tensors) + list(output_tensors):
            if x.dtype != dt:
                raise ValueError("mooncake-cpu: all_to_all tensors must share one dtype")
        code = _dtype_code(input_tensors[0])
        ib = torch.cat([_bytes(x.contiguous()) for x in input_tensors])
        sends = [x.numel() * x.element_size() for x in input_tensors]
        recvs = [x.numel() * x.element_size() for x in output_tensors]
        ob = torch.empty(sum(recvs), dtype=torch.uint8)

        def body():
            self._alltoall(ib, ob, sends, recvs, code)
            off = 0
            for x, n in zip(output_tensors, recvs):
                x.copy_(ob[off:off + n].view(x.dtype).view(x.shape))
                off += n
        return self._run(body, output_tensors, opts)

    def _alltoall(self, ib, ob, sends, recvs, code) -> None:
        c = self._comm
        soff = [sum(sends[:i]) for i in range(len(sends))]
        roff = [sum(recvs[:i]) for i in range(len(recvs))]
        sig = (5, code, 0, 0, 0)
        src = _Source(c, ib)
        mats = {}
        pieces = [1]  # known after piece one

        def piece(k):
            w = self._hdr_writes(sig, sends, recvs) if k == 0 else self._hdr_writes(sig)
            lo = k * c.P
            for p in self._others():
                n = min(c.P, max(0, sends[p] - lo))
                if n:
                    w.append((p, src.at(soff[p] + lo, n), n, c.H))
            par = c.exchange(w)
            self._check_headers(par, sig, 5)
            if k == 0:
                mats[c.rank] = (sends, recvs)
                for p in self._others():
                    h = c.peer_header(par, p)
                    mats[p] = (h[8:8 + c.G], h[8 + c.G:8 + 2 * c.G])
                bad = [(p, q) for p in c.active for q in c.active
                       if mats[p][0][q] != mats[q][1][p]]
                if bad:
                    p, q = bad[0]
                    raise ValueError(f"mooncake-cpu: all_to_all splits mismatch: rank {p} sends {mats[p][0][q]} "
                                     f"bytes to rank {q}, which expects {mats[q][1][p]}")
                big = max([mats[p][0][q] for p in c.active for q in c.active] + [0])
                pieces[0] = max(1, -(-big // c.P))
            for p in self._others():
                n = min(c.P, max(0, recvs[p] - lo))
                if n:
                    ob[roff[p] + lo:roff[p] + lo + n].copy_(self._slot(par, p, n))
        try:
            k = 0
            while k < pieces[0]:
                c.do_piece(lambda: piece(k))
                k += 1
        finally:
            src.close()
        me = c.rank
        if sends[me]:
            ob[roff[me]:roff[me] + recvs[me]].copy_(ib[soff[me]:soff[me] + sends[me]])

    # -- point to point --------------------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        fut = self._comm.p2p_engine.submit(tensors[0], dst, True)
        return _create_work_from_future(fut)

    def recv(self, tensors, src: int, tag: int = 0):
        fut = self._comm.p2p_engine.submit(tensors[0], src, False)
        return _create_work_from_future(fut)


# -- the official helpers -------------------------------------------------

def _pg(backend) -> MooncakeProcessGroup:
    if backend is None:
        backend = dist.distributed_c10d._get_default_group()
    if isinstance(backend, MooncakeProcessGroup):
        return backend
    try:
        b = backend._get_backend(torch.device("cpu"))
        if isinstance(b, MooncakeProcessGroup):
            return b
    except (RuntimeError, AttributeError):
        pass
    raise TypeError(f"mooncake.pg: {backend!r} is not a mooncake-cpu process group")


def get_active_ranks(backend=None) -> torch.Tensor:
    """The int32 active-rank tensor (1 = active), sized to max_group_size."""
    return _pg(backend)._mirror


def get_num_synced_ranks(backend=None) -> int:
    """How many ranks the last committed membership holds."""
    return _pg(backend)._comm.num_synced


def get_peer_state(backend, ranks: Sequence[int]) -> List[bool]:
    """Local, non-collective readiness of ranks: an active rank whose
    process lives, or a replacement waiting in join_group."""
    return _pg(backend)._comm.peer_state(list(ranks))


def activate_ranks(backend, ranks: Sequence[int]) -> None:
    """Adds ranks waiting in join_group to the group (one call from any
    active rank suffices; the others switch at their next collective)."""
    pg = _pg(backend)
    pg._drain()
    pg._comm.change(act=[int(r) for r in ranks])


recover_ranks = activate_ranks


def deactivate_ranks(backend, ranks: Sequence[int]) -> None:
    """Removes ranks from the group (one call from any active rank
    suffices; repeats are safe)."""
    pg = _pg(backend)
    pg._drain()
    if set(ranks) <= set(range(pg.size())) - set(pg._comm.active):
        return
    pg._comm.change(deact=[int(r) for r in ranks])


def join_group(backend=None) -> None:
    """A rank started with is_extension=True blocks here until an active
    rank activates it."""
    pg = _pg(backend)
    pg._drain()
    pg._comm.join()


def sync_after_failure(backend=None) -> None:
    """Reports this rank's observed failures, waits for the reconciled
    membership and applies it (automatic with auto_sync_on_failure)."""
    pg = _pg(backend)
    pg._drain()
    pg._comm.change()


def _create(dist_opts, backend_options) -> MooncakeProcessGroup:
    opts = backend_options if isinstance(backend_options, MooncakeBackendOptions) else None
    return MooncakeProcessGroup(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                                dist_opts.timeout, opts)


for _name in (BACKEND, "mooncake"):
    if _name not in dist.Backend.backend_list:
        dist.Backend.register_backend(_name, _create, extended_api=True, devices=["cpu"])
