"""The communicator under mooncake.pg: registered buffers, all-pairs steps
over the Transfer Engine, membership (epochs, failure and join syncs) and a
point-to-point channel per pair of ranks.

Memory. Each rank allocates, once, three engine buffers (shared memory on
one host, registered remote-accessible): ``ctrl`` (flags and counters,
u64 words), ``data`` (two parities x max_group_size slots of ``slot``
bytes; peer p writes into slot [parity][p]) and ``p2p`` (one slot per
sender), plus a local ``stage`` buffer (headers, reduction results, small
sources). Peers learn the addresses once, through the torch Store.

Steps. A collective is a series of all-pairs steps: every active rank
writes its payload (if any) into its slot at each peer, then writes the
step number into each peer's flag word for (itself, parity), then waits for
every peer's flag. A rank cannot pass step s+1 before every peer finished
step s (it needs their step s+1 flags, written after they consumed step
s), so two parities make slot reuse safe with no acknowledgements.

Membership. An epoch is a view (the active ranks) plus the step number the
view starts at. A rank that sees a peer die (its process gone on this
host, a failed write, or no flag within the timeout) or is asked to change
the membership raises the sync word in every peer's ctrl; every active
rank then reports (its suspects, its position = collective and piece) in
the Store, the first complete set of reports decides the next view
(compare-and-set), and every member applies it at one agreed position: the
furthest reported. A rank that was one piece behind finishes that piece
from the data already delivered first (every live peer had sent it).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import socket
import threading
import time
import uuid
from collections import deque
from typing import Dict, List, Optional, Sequence

import torch

from mooncake_go.engine import Op, Request, RequestArray, TransferEngine
from mooncake_go.errors import MooncakeError

#: Payload slot per (parity, sender); large collectives go in pieces.
DEFAULT_SLOT = 4 << 20
#: Point-to-point slot per sender.
P2P_SLOT = 256 << 10
#: The stage buffer copies sources piece by piece (a ring of
#: max_group_size slots) unless that would take more than this; then sources
#: are registered in place for each call instead (zero copy, but a
#: registration makes every peer refresh its view of this rank's memory).
STAGE_MAX = 64 << 20
#: Sources at least this large are registered in place anyway: there the
#: copies cost more than the peers' refresh.
REGISTER_MIN = 32 << 20
_MAGIC = 0x4D43504731  # "MCPG1"


class PeerFailure(RuntimeError):
    """A collective could not complete because ranks failed (or this rank
    was deactivated). The group's membership already excludes them when
    auto-sync is on."""

    def __init__(self, msg: str, ranks: Sequence[int] = ()):
        super().__init__(msg)
        self.ranks = sorted(ranks)


class _Restart(Exception):
    """The view changed at this rank's position: run the piece again."""


class _Decision:
    __slots__ = ("epoch", "view", "base", "pos", "dead")

    def __init__(self, epoch: int, d: dict):
        self.epoch = epoch
        self.view: List[int] = d["view"]
        self.base: int = d["base"]
        self.pos: int = d["pos"]
        self.dead: List[int] = d["dead"]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
#: Same-host peers' buffers are mapped and written with plain stores only
#: where stores become visible in program order (x86's TSO): a peer that
#: sees a flag then sees the data written before it.
_CAN_MAP = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
try:
    # A sequentially consistent exchange (xchg: a full barrier): a flag
    # stored with it is visible before this rank reads the other flags.
    _xchg = ctypes.CDLL("libatomic.so.1").__atomic_exchange_8
    _xchg.restype = ctypes.c_uint64
    _xchg.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
except (OSError, AttributeError):
    _xchg = None
_SEQ_CST = 5


def _memfd_of(addr: int):
    """(fd, inode) of the memfd the engine mapped at addr in this process
    (the engine keeps the descriptor open while the buffer lives), or None."""
    ino = None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if int(parts[0].split("-", 1)[0], 16) == addr:
                    if len(parts) == 6 and parts[5].startswith("/memfd:") and int(parts[2], 16) == 0:
                        ino = int(parts[4])
                    break
        if ino is None:
            return None
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.stat(f"/proc/self/fd/{name}").st_ino == ino and \
                        os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:"):
                    return int(name), ino
            except OSError:
                continue
    except (OSError, ValueError, IndexError):
        pass
    return None


class _Mapping:
    """A same-host peer's engine buffer mapped into this process (through
    /proc/<pid>/fd, as the engine's shared-memory path maps it), so steps
    copy into it and store its flag words directly: no engine batch, no
    worker thread to wake on a host whose cores the ranks already share."""

    __slots__ = ("remote", "size", "addr")

    def __init__(self, pid: int, fd: int, ino: int, remote: int, size: int):
        path = f"/proc/{pid}/fd/{fd}"
        f = os.open(path, os.O_RDWR)
        try:
            st = os.fstat(f)
            if st.st_ino != ino or st.st_size < size:
                raise OSError(f"{path} is not the buffer rank's engine published")
            a = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, f, 0)
            if a is None or a == _MAP_FAILED:
                raise OSError(ctypes.get_errno(), f"mmap {path}")
        finally:
            os.close(f)
        self.remote, self.size, self.addr = remote, size, a

    def close(self) -> None:
        if self.addr:
            _libc.munmap(self.addr, self.size)
            self.addr = 0


class _Peer:
    __slots__ = ("rank", "name", "ctrl", "data", "p2p", "pid", "host", "inc", "seg", "bells", "maps", "words",
                 "dbuf")

    def __init__(self, rank: int, info: dict, seg: int):
        self.rank = rank
        self.name = info["name"]
        self.ctrl, self.data, self.p2p = info["ctrl"], info["data"], info["p2p"]
        self.pid, self.host, self.inc = info["pid"], info["host"], info["inc"]
        self.seg = seg
        self.bells = [b.encode("latin-1") for b in info["bells"]] if info["host"] == socket.gethostname() else None
        self.maps: List[_Mapping] = []
        self.words = None  # its ctrl words, where mapped
        self.dbuf = None  # its data buffer (uint8 tensor), where mapped
        if self.bells is not None and _CAN_MAP and info.get("mem") and os.environ.get("MOONCAKE_PG_MAP", "1") != "0":
            try:
                for remote, size, fd, ino in info["mem"]:
                    self.maps.append(_Mapping(self.pid, fd, ino, remote, size))
            except OSError:
                self.unmap()  # the engine's batches serve it instead
            else:
                m, d = self.maps[0], self.maps[1]
                self.words = (ctypes.c_uint64 * (m.size // 8)).from_address(m.addr)
                self.dbuf = torch.frombuffer((ctypes.c_char * d.size).from_address(d.addr), dtype=torch.uint8)

    def local(self, remote: int, n: int) -> int:
        """This process's address of the peer's [remote, remote+n), or 0."""
        for m in self.maps:
            if m.remote <= remote and remote + n <= m.remote + m.size:
                return m.addr + (remote - m.remote)
        return 0

    def unmap(self) -> None:
        self.words = self.dbuf = None
        for m in self.maps:
            m.close()
        self.maps = []


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _pos(coll: int, piece: int) -> int:
    return (coll << 32) | piece


class Comm:
    """One rank's side of one process group (see the module doc)."""

    def __init__(self, engine: TransferEngine, store, rank: int, size: int, max_group: int,
                 initial: Sequence[int], is_extension: bool, auto_deactivate: bool, auto_sync: bool,
                 timeout: float, slot: int = 0, on_view=None):
        self.eng = engine
        self.store = store
        self.rank, self.size, self.G = rank, size, max_group
        self.auto_deactivate, self.auto_sync = auto_deactivate, auto_sync
        self.timeout = timeout
        self.on_view = on_view
        self.threads = int(os.environ.get("MOONCAKE_PG_THREADS", 0) or 1)
        G = max_group
        # Header of a slot: magic, signature (5 words), piece, then bytes
        # sent to and expected from each rank (all_to_all's matrices).
        self.H = (8 * (8 + 2 * G) + 63) // 64 * 64
        # The default slot holds a power of two of payload after its
        # header, so power-of-two tensors split into whole pieces (a 16 MiB
        # all_reduce in one reduce-scatter + all-gather, not two with a
        # 128-element tail).
        self.slot = slot or int(os.environ.get("MOONCAKE_PG_SLOT_BYTES", 0)) or self.H + max(
            256 << 10, min(DEFAULT_SLOT, (256 << 20) // (2 * max_group)))
        self.slot = (self.slot + 4095) // 4096 * 4096
        self.P = self.slot - self.H
        if self.P < 4096:
            raise ValueError("mooncake-cpu: MOONCAKE_PG_SLOT_BYTES too small for max_group_size")
        # ctrl words: 0 sync word, [8, 8+2G) flags[p][parity], then p2p
        # posted[p], p2p acked[p], scratch words.
        self._F, self._POST, self._ACK = 8, 8 + 2 * G, 8 + 3 * G
        self._SCR = 8 + 4 * G
        nwords = self._SCR + 8 + 2 * G
        self._bufs = []
        self.ctrl = self._alloc((nwords * 8 + 4095) // 4096 * 4096)
        self.data = self._alloc(2 * G * self.slot)
        self.p2p = self._alloc(G * P2P_SLOT)
        self.stage_cap = G * self.slot if G * self.slot <= STAGE_MAX else 0
        self.stage = self._alloc(self.H + self.slot + self.stage_cap + G * P2P_SLOT)
        self.words = (ctypes.c_uint64 * nwords).from_address(self.ctrl.addr)
        self.dbuf = torch.frombuffer(self.data.view(), dtype=torch.uint8)
        self.pbuf = torch.frombuffer(self.p2p.view(), dtype=torch.uint8)
        self.sbuf = torch.frombuffer(self.stage.view(), dtype=torch.uint8)
        self._hdr_words = (ctypes.c_uint64 * (self.H // 8)).from_address(self.stage.addr)
        self.red_off = self.H  # reduction results: slot bytes
        self.src_off = self.H + self.slot  # sources: a ring of stage_cap bytes
        self.src_cur = 0
        self.p2p_stage_off = self.src_off + self.stage_cap

        self.host = socket.gethostname()
        self.inc = uuid.uuid4().hex
        # Doorbells: a waiting rank sleeps in the kernel on a datagram
        # socket and a same-host peer rings it after writing a flag (the
        # flags stay the truth; a bell carries nothing), so waiting holds
        # no CPU on a busy host. One for steps, one for P2P.
        self.bells = []
        for kind in ("s", "p"):
            b = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            b.bind(f"\0mooncake-pg-{self.inc}-{kind}")
            self.bells.append(b)
        self.peers: Dict[int, _Peer] = {}
        self.epoch = 0
        self.step = 0
        self.coll = 0
        self.piece = 0
        self.in_coll = False
        self.pending: Optional[_Decision] = None
        self.excluded = False
        self.joined = not is_extension
        self.closed = False
        self.observed: set = set()  # failures seen but not synced (auto-sync off)
        self.lock = threading.Lock()  # one collective at a time
        info = {"name": engine.name, "ctrl": self.ctrl.addr, "data": self.data.addr, "p2p": self.p2p.addr,
                "pid": os.getpid(), "host": self.host, "inc": self.inc,
                "bells": [b.getsockname() if isinstance(b.getsockname(), str) else b.getsockname().decode("latin-1")
                          for b in self.bells], "slot": self.slot, "G": G, "mem": self._mem_info()}
        store.set(f"peer/{rank}", json.dumps(info))
        if is_extension:
            self.active = [rank]
            self.num_synced = 1
        else:
            self.active = sorted(initial)
            if rank not in self.active:
                raise ValueError(f"mooncake-cpu: rank {rank} is not in active_ranks; start it with is_extension=True")
            keys = [f"peer/{r}" for r in self.active]
            store.wait(keys)
            for r in self.active:
                if r != rank:
                    self._load_peer(r)
            self.num_synced = len(self.active)
        self.p2p_engine = _P2P(self)

    # -- memory ----------------------------------------------------------

    def _mem_info(self) -> list:
        """(address, size, memfd, inode) of ctrl, data and p2p, for
        same-host peers to map; empty where a buffer's memfd is not found."""
        out = []
        for b in (self.ctrl, self.data, self.p2p):
            fd = _memfd_of(b.addr)
            if fd is None:
                return []
            out.append((b.addr, b.size, fd[0], fd[1]))
        return out

    def _alloc(self, n: int):
        b = self.eng.allocate_buffer(n)
        self._bufs.append(b)
        return b

    def _load_peer(self, r: int) -> _Peer:
        info = json.loads(self.store.get(f"peer/{r}"))
        if info["slot"] != self.slot or info["G"] != self.G:
            raise ValueError(f"mooncake-cpu: rank {r} uses slot {info['slot']} bytes and max_group_size "
                             f"{info['G']}, this rank {self.slot} and {self.G}: set them alike on every rank")
        old = self.peers.get(r)
        if old is not None and old.inc == info["inc"]:
            return old
        if old is not None:
            old.unmap()
            try:
                self.eng.close_segment(old.name)
            except MooncakeError:
                pass
            # A replacement starts its P2P chunk counts at zero: so must
            # this rank's counts and words for that pair.
            self.p2p_engine.reset_peer(r)
        p = self.peers[r] = _Peer(r, info, self.eng.open_segment(info["name"]))
        return p

    def all_mapped(self) -> bool:
        """Whether every other active rank's buffers are mapped here (steps
        then write with plain copies, from any memory)."""
        peers = self.peers
        return all(p == self.rank or (p in peers and peers[p].maps) for p in self.active)

    def own_slot(self, par: int, p: int, n: int) -> torch.Tensor:
        """n payload bytes of rank p's own slot [par][p] in p's data buffer
        (mapped; this rank's own buffer for p == rank): where a rank
        publishes data for its peers to read in place."""
        buf = self.dbuf if p == self.rank else self.peers[p].dbuf
        o = self.slot_off(par, p) + self.H
        return buf[o:o + n]

    def slot_off(self, parity: int, sender: int) -> int:
        """Offset in a receiver's data buffer of sender's slot."""
        return (parity * self.G + sender) * self.slot

    # -- transfers -------------------------------------------------------

    def _write(self, reqs: List[tuple]) -> None:
        """reqs: (peer rank, local addr, remote addr, length). Raises
        PeerFailure naming the ranks whose writes failed."""
        if not reqs:
            return
        peers = self.peers
        rest = []
        for r in reqs:
            p, a, ra, n = r
            dst = peers[p].local(ra, n) if peers[p].maps else 0
            if dst:
                ctypes.memmove(dst, a, n)
            else:
                rest.append(r)
        if not rest:
            return
        reqs = rest
        arr = RequestArray([Request(Op.WRITE, a, self.peers[p].seg, ra, n) for p, a, ra, n in reqs])
        try:
            self.eng.transfer(arr, timeout=self.timeout)
            return
        except MooncakeError:
            pass
        bad = set()
        for p, a, ra, n in reqs:
            try:
                self.eng.transfer([Request(Op.WRITE, a, self.peers[p].seg, ra, n)], timeout=self.timeout)
            except MooncakeError:
                bad.add(p)
        if bad:
            raise PeerFailure(f"mooncake-cpu: writes to ranks {sorted(bad)} failed", bad)

    def _write_word(self, peers: Sequence[int], scratch: int, value: int, word: int, bell: int = 0) -> None:
        """Writes value (through scratch word) into each peer's ctrl word
        and rings their bell."""
        self.words[scratch] = value
        src = self.ctrl.addr + 8 * scratch
        rest = []
        for p in peers:
            w = self.peers[p].words
            if w is not None:
                w[word] = value  # after the data stores (TSO): see _CAN_MAP
            else:
                rest.append((p, src, self.peers[p].ctrl + 8 * word, 8))
        self._write(rest)
        for p in peers:
            self.ring(p, bell)

    def ring(self, p: int, bell: int) -> None:
        addr = self.peers[p].bells
        if addr is not None:
            try:
                self.bells[bell].sendto(b"!", socket.MSG_DONTWAIT, addr[bell])
            except OSError:
                pass  # gone, or its queue is full of rings already

    def doze(self, bell: int, seconds: float) -> None:
        """Sleeps until a ring (or seconds), then takes every queued ring."""
        b = self.bells[bell]
        b.settimeout(seconds)
        try:
            b.recv(16)
        except (OSError, socket.timeout):
            return
        # A socket with a timeout polls for it even with MSG_DONTWAIT:
        # drain in non-blocking mode.
        b.setblocking(False)
        try:
            while True:
                b.recv(16)
        except OSError:
            pass

    # -- steps -----------------------------------------------------------

    def exchange(self, writes: List[tuple]) -> int:
        """One all-pairs step over the active ranks. writes: (peer, local
        addr, length, offset in the peer's slot). Returns the parity whose
        slots hold what peers sent."""
        s = self.step + 1
        par = s & 1
        peers = [p for p in self.active if p != self.rank]
        if peers:
            try:
                base = self.slot_off(par, self.rank)
                self._write([(p, a, self.peers[p].data + base + off, n) for p, a, n, off in writes])
                self._post_flags(peers, par, s)
            except PeerFailure as e:
                self._failed(set(e.ranks))
            self._wait_flags(par, s, peers)
        self.step = s
        return par

    def _post_flags(self, peers: List[int], par: int, s: int) -> None:
        """Writes step s's flag into every peer's ctrl and rings the peers
        that wait. A mapped peer's flag is stored with a full barrier and
        the peer rung only when every flag it waits for is there (whoever
        stores the last one sees all of them: the barriers order the
        stores), so a sleeping rank wakes once per step, not once per
        peer; the others' flags are written and rung as always."""
        word = self._F + 2 * self.rank + par
        if _xchg is None:
            self._write_word(peers, self._SCR + par, s, word)
            return
        mapped, rest = [], []
        for p in peers:
            peer = self.peers[p]
            if peer.words is None:
                rest.append(p)
            else:
                _xchg(peer.maps[0].addr + 8 * word, s, _SEQ_CST)
                mapped.append(peer)
        F, act = self._F, self.active
        for peer in mapped:
            w = peer.words
            if all(w[F + 2 * q + par] == s for q in act if q != peer.rank):
                self.ring(peer.rank, 0)
        if rest:
            self._write_word(rest, self._SCR + par, s, word)

    def _wait_flags(self, par: int, s: int, peers: List[int]) -> None:
        w, F = self.words, self._F
        pending = [p for p in peers if w[F + 2 * p + par] != s]
        spins = 0
        start = check = 0.0
        while pending:
            pending = [p for p in pending if w[F + 2 * p + par] != s]
            if not pending:
                return
            spins += 1
            if spins < 20:
                continue
            now = time.monotonic()
            if spins == 20:
                start, check = now, now + 0.005
            if all(self.peers[p].bells is not None for p in pending):
                self.doze(0, 0.02)
            elif spins < 3000:
                os.sched_yield()
            else:
                time.sleep(0.0002)
            if w[0] > self._known_epoch():
                self._on_sync_request(pending)
                continue
            if now >= check:
                check = now + 0.02
                dead = {p for p in pending if not self._alive(p)}
                if not dead and now - start > self.timeout:
                    dead = set(pending)
                if dead:
                    self._failed(dead)

    def _alive(self, r: int) -> bool:
        p = self.peers.get(r)
        if p is None:
            return False
        if p.host == self.host:
            return _pid_alive(p.pid)
        return True  # remote: the timeout decides

    def _known_epoch(self) -> int:
        return self.pending.epoch if self.pending is not None else self.epoch

    def _failed(self, dead: set) -> None:
        """Peers in dead failed during this rank's current piece."""
        if self.pending is not None:
            # Draining a piece behind the agreed position: a peer that
            # has not delivered by now never will.
            raise PeerFailure(f"mooncake-cpu: ranks {sorted(dead)} failed during this collective", dead)
        if not (self.auto_deactivate and self.auto_sync):
            self.observed |= dead
            raise PeerFailure(f"mooncake-cpu: ranks {sorted(dead)} failed (call sync_after_failure)", dead)
        self.sync(suspects=dead)
        self._after_decision()

    def _on_sync_request(self, pending: List[int]) -> None:
        if self.pending is not None:
            missing = set(pending) & set(self.pending.dead)
            if missing:
                raise PeerFailure(f"mooncake-cpu: ranks {sorted(missing)} failed during this collective", missing)
            return
        self.sync()
        self._after_decision()

    def _after_decision(self) -> None:
        d = self.pending
        if d.pos > _pos(self.coll, self.piece):
            # Behind the agreed position: finish this piece from what
            # arrived (the others finished it), even if the new view
            # leaves this rank out; do_piece tells it so at the next one.
            return
        if self.rank not in d.view:
            self._apply(d)
            raise PeerFailure("mooncake-cpu: this rank was deactivated by the group", [self.rank])
        raise _Restart()

    # -- collectives -----------------------------------------------------

    def run(self, body):
        """Runs a collective body (a callable doing pieces)."""
        with self.lock:
            if self.closed:
                raise RuntimeError("mooncake-cpu: the process group was destroyed")
            if self.excluded:
                raise PeerFailure("mooncake-cpu: this rank is not active in the group any more", [self.rank])
            self.coll += 1
            self.piece = 0
            self.in_coll = True
            # Reductions and copies run on this thread alone: torch's
            # intra-op threads, on a host whose cores the other ranks use
            # too, wait for each other far longer than they save.
            threads = torch.get_num_threads()
            if threads != self.threads:
                torch.set_num_threads(self.threads)
            try:
                return body()
            finally:
                self.in_coll = False
                if threads != self.threads:
                    torch.set_num_threads(threads)

    def do_piece(self, fn):
        """Runs one piece of the current collective; again, over the new
        view, when the membership changes at this piece."""
        self.piece += 1
        while True:
            d = self.pending
            if d is not None and d.pos <= _pos(self.coll, self.piece):
                self._apply(d)
                if self.excluded:
                    raise PeerFailure("mooncake-cpu: this rank was deactivated by the group", [self.rank])
            elif self.words[0] > self._known_epoch() and self.joined:
                self.sync()
                continue
            try:
                return fn()
            except _Restart:
                continue

    # -- membership ------------------------------------------------------

    def sync(self, suspects=(), deact=(), act=()) -> _Decision:
        """Takes part in the sync for the next epoch and returns its
        decision (kept as pending until applied)."""
        e = self.epoch + 1
        others = [p for p in self.active if p != self.rank and p not in suspects]
        try:
            self._write_word(others, self._SCR + 2, e, 0)
        except PeerFailure as err:
            suspects = set(suspects) | set(err.ranks)
        pos = _pos(self.coll, self.piece) if self.in_coll else _pos(self.coll + 1, 0)
        mine = {"sus": sorted(set(suspects) | self.observed), "pos": pos, "step": self.step,
                "deact": sorted(deact), "act": sorted(act)}
        st = self.store
        st.set(f"ft/{e}/rep/{self.rank}", json.dumps(mine))
        deadline = time.monotonic() + self.timeout
        key = f"ft/{e}/view"
        while True:
            if st.check([key]):
                break
            reps = {self.rank: mine}
            for r in self.active:
                k = f"ft/{e}/rep/{r}"
                if st.check([k]):
                    reps[r] = json.loads(st.get(k))
            gone = set()
            for rep in reps.values():
                gone |= set(rep["sus"]) | set(rep["deact"])
            needed = set(self.active) - gone
            late = needed - set(reps)
            if late and time.monotonic() > deadline:
                gone |= late
                late = set()
            if not late:
                view = set(self.active) - gone
                for rep in reps.values():
                    view |= {a for a in rep["act"] if st.check([f"join/{a}"])}
                dec = {"view": sorted(view), "dead": sorted(set(self.active) - view),
                       "base": max(rep["step"] for rep in reps.values()) + 8,
                       "pos": max(rep["pos"] for rep in reps.values())}
                st.compare_set(key, "", json.dumps(dec))
                break
            time.sleep(0.002)
        d = _Decision(e, json.loads(st.get(key)))
        self.observed.clear()
        self.pending = d
        return d

    def _apply(self, d: _Decision) -> None:
        """Waits (bounded) for every member of d to reach it, then uses it."""
        st = self.store
        # Peers (replacements among them) are loaded before this rank says
        # ready: a member that saw every ready may write to it at once.
        for r in d.view:
            if r != self.rank:
                self._load_peer(r)
        st.set(f"ft/{d.epoch}/ready/{self.rank}", "1")
        deadline = time.monotonic() + self.timeout
        for r in d.view:
            while not st.check([f"ft/{d.epoch}/ready/{r}"]) and time.monotonic() < deadline:
                time.sleep(0.002)
        self.active = list(d.view)
        self.step = d.base
        self.epoch = d.epoch
        self.pending = None
        self.num_synced = len(d.view)
        self.excluded = self.rank not in d.view
        if self.rank in d.view:
            self.joined = True
        if self.on_view:
            self.on_view(self.active)

    def change(self, deact=(), act=()) -> None:
        """deactivate_ranks / activate_ranks / sync_after_failure from the
        API: runs a sync between collectives and applies it."""
        with self.lock:
            if not self.joined:
                raise RuntimeError("mooncake-cpu: this rank has not joined the group (call join_group)")
            if self.pending is None:
                self.sync(deact=deact, act=act)
            self._apply(self.pending)

    def join(self) -> None:
        """join_group: announce, then wait for a view that has this rank."""
        with self.lock:
            if self.joined:
                return
            st = self.store
            st.set(f"join/{self.rank}", self.inc)
            while True:
                # Views are decided in epoch order, each under its own key:
                # follow them from the first this rank has not seen. (A
                # counter of the latest epoch, set by each rank once it
                # decided, could move back when a slow rank set it late.)
                e = max(self.epoch + 1, 1)
                while st.check([f"ft/{e}/view"]):
                    d = _Decision(e, json.loads(st.get(f"ft/{e}/view")))
                    self.epoch = e
                    if self.rank in d.view:
                        self.coll = (d.pos >> 32) - 1
                        self._apply(d)
                        st.delete_key(f"join/{self.rank}")
                        return
                    e += 1
                time.sleep(0.005)

    def peer_state(self, ranks: Sequence[int]) -> List[bool]:
        """Local readiness: active and alive, or waiting in join_group."""
        out = []
        for r in ranks:
            if r in self.active:
                out.append(r == self.rank or self._alive(r))
            else:
                out.append(bool(self.store.check([f"join/{r}"])))
        return out

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.p2p_engine.close()
        for p in self.peers.values():
            p.unmap()
        for b in self.bells:
            b.close()
        for b in self._bufs:
            try:
                b.free()
            except MooncakeError:
                pass
        self._bufs = []

    # -- headers ---------------------------------------------------------

    def header(self, sig: Sequence[int], piece: int, sends: Sequence[int] = (), expects: Sequence[int] = ()) -> int:
        """Fills this rank's header in the stage buffer; returns its address."""
        w = self._hdr_words
        w[0] = _MAGIC
        for i in range(5):
            w[1 + i] = sig[i] if i < len(sig) else 0
        w[6] = piece
        G = self.G
        for i in range(G):
            w[8 + i] = sends[i] if sends else 0
            w[8 + G + i] = expects[i] if expects else 0
        return self.stage.addr

    def peer_header(self, par: int, p: int) -> List[int]:
        off = self.data.addr + self.slot_off(par, p)
        return list((ctypes.c_uint64 * (self.H // 8)).from_address(off))


class _P2POp:
    __slots__ = ("tensor", "peer", "nbytes", "done", "fut", "send", "deadline")

    def __init__(self, tensor, peer, send, fut, timeout):
        self.tensor = tensor.view(-1).view(torch.uint8) if tensor.numel() else tensor.new_empty(0, dtype=torch.uint8)
        self.nbytes = tensor.numel() * tensor.element_size()
        self.peer, self.send, self.fut = peer, send, fut
        self.done = 0
        self.deadline = time.monotonic() + timeout


class _P2P:
    """Point-to-point channels: sender p writes a chunk into receiver's
    p2p slot p and then the word posted[p] = (count << 32 | last << 31 |
    length); the receiver copies it out and writes acked[receiver] = count
    into the sender's ctrl. One chunk in flight per direction and pair;
    one thread progresses every pending send and receive, so a rank's
    isend and irecv never wait on each other."""

    def __init__(self, comm: Comm):
        self.c = comm
        self.cv = threading.Condition()
        self.sends: Dict[int, deque] = {}
        self.recvs: Dict[int, deque] = {}
        self.sent: Dict[int, int] = {}
        self.got: Dict[int, int] = {}
        self.thread: Optional[threading.Thread] = None
        self.stop = False

    def submit(self, tensor, peer: int, send: bool):
        c = self.c
        if c.closed:
            raise RuntimeError("mooncake-cpu: the process group was destroyed")
        if peer == c.rank or not 0 <= peer < c.size:
            raise ValueError(f"mooncake-cpu: bad peer rank {peer} for rank {c.rank} of {c.size}")
        if peer not in c.active:
            raise PeerFailure(f"mooncake-cpu: rank {peer} is not active", [peer])
        if peer not in c.peers:
            c._load_peer(peer)
        if not tensor.is_contiguous():
            raise ValueError("mooncake-cpu: send/recv need contiguous tensors")
        fut = torch.futures.Future()
        op = _P2POp(tensor, peer, send, fut, c.timeout)
        with self.cv:
            (self.sends if send else self.recvs).setdefault(peer, deque()).append(op)
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="mooncake-pg-p2p", daemon=True)
                self.thread.start()
            self.cv.notify()
        return fut

    def reset_peer(self, p: int) -> None:
        """Starts the pair's chunk counts over (p is a new process)."""
        with self.cv:
            self.sent.pop(p, None)
            self.got.pop(p, None)
            self.c.words[self.c._POST + p] = 0
            self.c.words[self.c._ACK + p] = 0

    def close(self) -> None:
        with self.cv:
            self.stop = True
            self.cv.notify()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)

    def _loop(self) -> None:
        idle = 0
        while True:
            with self.cv:
                while not self.stop and not any(self.sends.values()) and not any(self.recvs.values()):
                    self.cv.wait()
                if self.stop:
                    for q in list(self.sends.values()) + list(self.recvs.values()):
                        for op in q:
                            op.fut.set_exception(RuntimeError("mooncake-cpu: the process group was destroyed"))
                        q.clear()
                    return
                heads = [q[0] for q in self.sends.values() if q] + [q[0] for q in self.recvs.values() if q]
            moved = False
            for op in heads:
                try:
                    moved |= self._progress(op)
                except Exception as e:  # noqa: BLE001 - handed to the waiter
                    self._finish(op, e)
            if moved:
                idle = 0
                continue
            idle += 1
            if idle < 20:
                continue
            self.c.doze(1, 0.01)
            if idle % 20 == 0:
                now = time.monotonic()
                for op in heads:
                    if not self.c._alive(op.peer) or now > op.deadline:
                        self._finish(op, PeerFailure(f"mooncake-cpu: rank {op.peer} did not answer a "
                                                     f"{'send' if op.send else 'recv'}", [op.peer]))

    def _finish(self, op: _P2POp, err=None) -> None:
        with self.cv:
            q = (self.sends if op.send else self.recvs)[op.peer]
            if q and q[0] is op:
                q.popleft()
        if err is None:
            op.fut.set_result([op.tensor])
        else:
            op.fut.set_exception(err)

    def _progress(self, op: _P2POp) -> bool:
        c, p = self.c, op.peer
        peer = c.peers[p]
        if op.send:
            k = self.sent.get(p, 0)
            if c.words[c._ACK + p] != k:
                return False  # the previous chunk is not consumed yet
            n = min(P2P_SLOT, op.nbytes - op.done)
            last = op.done + n == op.nbytes
            off = c.p2p_stage_off + p * P2P_SLOT
            if n:
                c.sbuf[off:off + n].copy_(op.tensor[op.done:op.done + n])
                c._write([(p, c.stage.addr + off, peer.p2p + c.rank * P2P_SLOT, n)])
            scr = c._SCR + 8 + p
            c._write_word([p], scr, ((k + 1) << 32) | (int(last) << 31) | n, c._POST + c.rank, bell=1)
            self.sent[p] = k + 1
            op.done += n
            if last:
                self._finish(op)
            return True
        k = self.got.get(p, 0)
        v = c.words[c._POST + p]
        if v >> 32 != k + 1:
            return False
        n, last = v & 0x7FFFFFFF, bool(v >> 31 & 1)
        if op.done + n > op.nbytes or (last and op.done + n != op.nbytes):
            err = ValueError(f"mooncake-cpu: recv of {op.nbytes} bytes from rank {p} does not match "
                             f"the size rank {p} sent")
            self._drain(p, v, k, last)
            raise err
        if n:
            op.tensor[op.done:op.done + n].copy_(c.pbuf[p * P2P_SLOT:p * P2P_SLOT + n])
        try:
            self._ack(p, k + 1)
        except PeerFailure:
            # The ack only frees the sender's slot for its next chunk: a
            # sender gone after its last one (its send was complete) is
            # no failure of this recv.
            if not last:
                raise
        op.done += n
        if last:
            self._finish(op)
        return True

    def _ack(self, p: int, k: int) -> None:
        c = self.c
        self.got[p] = k
        c._write_word([p], c._SCR + 8 + c.G + p, k, c._ACK + c.rank, bell=1)

    def _drain(self, p: int, v: int, k: int, last: bool) -> None:
        """Consumes the rest of a mismatched message so the pair stays usable."""
        self._ack(p, k + 1)
        deadline = time.monotonic() + self.c.timeout
        while not last and time.monotonic() < deadline:
            v = self.c.words[self.c._POST + p]
            if v >> 32 == self.got[p] + 1:
                last = bool(v >> 31 & 1)
                self._ack(p, self.got[p] + 1)
            else:
                time.sleep(0.0002)
