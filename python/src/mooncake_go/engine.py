"""The Transfer Engine: batched, zero-copy moves between registered memory
of this process and segments of other engines.

Lifecycle::

    with TransferEngine(host="127.0.0.1") as eng:       # listens, P2PHANDSHAKE
        eng.register_memory(buf)                          # buf: numpy / torch / bytearray / addr
        seg = eng.open_segment("10.0.0.7:15123")          # a peer's name
        eng.write(seg, buf, remote_addr)                  # one request, waits
        eng.transfer([Request(Op.WRITE, a, seg, r, n), ...])   # a batch, waits

Calls release the GIL (ctypes), so several Python threads may drive one
engine at once; the library is safe for concurrent use of one handle.
"""

from __future__ import annotations

import ctypes
import enum
import sys
from array import array
from ctypes import byref, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _lib, errors
from ._buffers import Buffer, address
from .errors import MooncakeError, TransferFailed

lib = _lib.lib

#: The engine's own segment (requests to it copy within this process).
LOCAL_SEGMENT = _lib.LOCAL_SEGMENT


class Op(enum.IntEnum):
    """Direction of a request, numbered as Mooncake's OPCODE_READ/WRITE."""

    READ = _lib.OP_READ
    WRITE = _lib.OP_WRITE


class State(enum.IntEnum):
    """Task and batch states, numbered as Mooncake's STATUS_*."""

    WAITING = _lib.WAITING
    PENDING = _lib.PENDING
    INVALID = _lib.INVALID
    CANCELED = _lib.CANCELED
    COMPLETED = _lib.COMPLETED
    TIMEOUT = _lib.TIMEOUT
    FAILED = _lib.FAILED


class Request(NamedTuple):
    """One transfer: ``length`` bytes between local registered memory and
    the absolute address ``remote`` in ``segment``. ``local`` is an address
    or a buffer object; ``length`` None means the whole local buffer."""

    op: Op
    local: Buffer
    segment: int
    remote: int
    length: Optional[int] = None


class Status(NamedTuple):
    """A task's or a batch's state, failure code and bytes moved so far."""

    state: State
    error_code: int
    transferred: int


class Notify(NamedTuple):
    """A notification received from a peer engine."""

    name: str
    msg: str


class RequestArray:
    """A reusable C array of requests, for hot loops: fill it once (or
    update single entries with :meth:`set`) and pass it to
    :meth:`TransferEngine.submit` as often as needed, with no per-call
    conversion."""

    __slots__ = ("_buf", "_ptr", "n")

    def __init__(self, requests: Iterable[Request] = (), capacity: Optional[int] = None):
        reqs = list(requests)
        self.n = len(reqs) if capacity is None else capacity
        if len(reqs) > self.n:
            raise ValueError("more requests than capacity")
        self._buf = (_lib.Request * max(self.n, 1))()
        self._ptr = ctypes.addressof(self._buf)
        for i, r in enumerate(reqs):
            self.set(i, r)

    def set(self, i: int, r: Request) -> None:
        if not 0 <= i < self.n:
            raise IndexError(i)
        if not isinstance(self._buf, ctypes.Array):
            raise TypeError("this RequestArray was built by RequestArray.of; build a new one")
        addr, n = address(r.local, r.length, writable=r.op == Op.READ)
        e = self._buf[i]
        e.opcode, e.local, e.segment, e.remote_addr, e.length = int(r.op), addr, int(r.segment), int(r.remote), n

    def __len__(self) -> int:
        return self.n

    @classmethod
    def of(cls, op: Op, segment: int, locals_: Sequence[int], remotes: Sequence[int],
           lengths: Sequence[int]) -> "RequestArray":
        """Requests from parallel lists of raw addresses and lengths (the
        shape of Mooncake's batch calls), built in C loops: no object per
        request."""
        n = len(locals_)
        if len(remotes) != n or len(lengths) != n:
            raise ValueError("buffers, peer addresses and lengths differ in number")
        if sys.byteorder != "little":  # the word layout below assumes it
            return cls([Request(op, loc, segment, rem, ln) for loc, rem, ln in zip(locals_, remotes, lengths)])
        self = cls.__new__(cls)
        self.n = n
        # mc_request_t is five 8-byte words: opcode (with the zero reserved
        # word above it, little-endian), local, segment, remote, length.
        words = array("Q", bytes(40 * max(n, 1)))
        if n:
            words[0::5] = array("Q", [int(op)]) * n
            words[1::5] = array("Q", locals_)
            words[2::5] = array("Q", [segment]) * n
            words[3::5] = array("Q", remotes)
            words[4::5] = array("Q", lengths)
        self._buf = words
        self._ptr = words.buffer_info()[0]
        return self


class SharedBuffer:
    """Memory the engine allocated (shared memory, registered): use it
    through ``b.view()`` (a memoryview; ``numpy.frombuffer(b.view(), ...)``;
    ``memoryview(b)`` on Python 3.12+) or by address ``b.addr``. Free it
    with :meth:`free` or a ``with`` block; views die with it."""

    def __init__(self, engine: "TransferEngine", addr: int, size: int):
        self._engine = engine
        self.addr = addr
        self.size = size
        self._view = (ctypes.c_char * size).from_address(addr) if size else bytearray()

    def __buffer__(self, flags):  # Python 3.12+
        return memoryview(self._view)

    def view(self) -> memoryview:
        """A writable memoryview of the buffer (valid until freed)."""
        return memoryview(self._view).cast("B")

    def free(self) -> None:
        if self.addr:
            addr, self.addr = self.addr, 0
            _lib.call(lib.mc_engine_free_buffer, self._engine.handle, addr)

    def __enter__(self) -> "SharedBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __len__(self) -> int:
        return self.size


class TransferEngine(_lib.Owned):
    """An engine: its listeners, registered memory, opened segments and
    batches. Every argument is optional; zero/None means the library's
    default (shown in brackets).

    :param metadata: where segment descriptors live: ``"P2PHANDSHAKE"``
        [default], ``"etcd://h:p"``, ``"http://h:p/metadata"``.
    :param local_server_name: this engine's segment name
        [``"<host>:<rpc port>"``]; in P2PHANDSHAKE mode the rpc port
        replaces any port given.
    :param host: address peers reach this engine at and its sockets bind
        [MC_TCP_BIND_ADDRESS, else the host of local_server_name if an IP,
        else the first non-loopback IPv4, else 127.0.0.1].
    :param transport: ``"auto"`` [shared memory on this host, TCP
        elsewhere], ``"tcp"`` or ``"shm"``.
    :param secret: shared secret every peer must know [MC_TE_SECRET, else
        none].
    :param rpc_port: handshake port [a free port]. ``data_port``: TCP data
        port [a free port].
    :param lanes: TCP connections per peer [4]. ``slice_size``: the
        largest piece a request is cut into, at least 4096 [128 KiB].
        ``timeout_ms``: per-request deadline [MC_TRANSFER_TIMEOUT s, else
        30 s]. ``max_retries``: retries of a slice on another lane [3].
    """

    def __init__(
        self,
        *,
        metadata: Optional[str] = None,
        local_server_name: Optional[str] = None,
        host: Optional[str] = None,
        transport: Optional[str] = None,
        secret: Optional[str] = None,
        rpc_port: int = 0,
        data_port: int = 0,
        lanes: int = 0,
        slice_size: int = 0,
        timeout_ms: int = 0,
        max_retries: int = 0,
    ):
        cfg = _lib.EngineConfig()
        cfg.struct_size = ctypes.sizeof(cfg)
        cfg.lanes = lanes
        cfg.metadata = _lib.cstr(metadata)
        cfg.local_server_name = _lib.cstr(local_server_name)
        cfg.host = _lib.cstr(host)
        cfg.transport = _lib.cstr(transport)
        cfg.secret = _lib.cstr(secret)
        cfg.rpc_port, cfg.data_port = rpc_port, data_port
        cfg.slice_size, cfg.timeout_ms, cfg.max_retries = slice_size, timeout_ms, max_retries
        h = c_uint64()
        _lib.call(lib.mc_engine_create, byref(cfg), byref(h))
        self._own(h.value, lib.mc_engine_destroy)
        self._segments: dict = {}

    # -- identity --------------------------------------------------------

    @property
    def name(self) -> str:
        """The segment name peers open to reach this engine ("ip:port")."""
        return _lib.read_string(lib.mc_engine_name, self.handle)

    @property
    def ports(self) -> Tuple[int, int]:
        """(handshake/RPC port, TCP data port)."""
        rpc, data = c_uint32(), c_uint32()
        _lib.call(lib.mc_engine_ports, self.handle, byref(rpc), byref(data))
        return rpc.value, data.value

    @property
    def rpc_port(self) -> int:
        """The handshake (RPC) port: the port of :attr:`name` in P2PHANDSHAKE mode."""
        return self.ports[0]

    # -- memory ----------------------------------------------------------

    def register_memory(self, buf: Buffer, length: Optional[int] = None, *, location: str = "*",
                        remote_accessible: bool = True) -> int:
        """Registers buf (or ``length`` bytes of it) and returns its address.
        Keep buf alive until :meth:`unregister_memory`."""
        addr, n = address(buf, length)
        _lib.call(lib.mc_engine_register_memory, self.handle, addr, n, _lib.cstr(location), int(remote_accessible))
        return addr

    def unregister_memory(self, buf: Buffer) -> None:
        """Unregisters the region registered at buf's address."""
        addr = buf if isinstance(buf, int) else address(buf)[0]
        _lib.call(lib.mc_engine_unregister_memory, self.handle, addr)

    def allocate_buffer(self, size: int, location: Optional[str] = None) -> SharedBuffer:
        """Maps ``size`` bytes of shared memory, registered remote-accessible
        (a same-host peer copies into it with one memcpy)."""
        p = c_void_p()
        _lib.call(lib.mc_engine_allocate_buffer, self.handle, size, _lib.cstr(location), byref(p))
        return SharedBuffer(self, p.value or 0, size)

    # -- segments --------------------------------------------------------

    def open_segment(self, name: str) -> int:
        """The id of the peer segment ``name`` (cached; the engine's own
        name gives :data:`LOCAL_SEGMENT`)."""
        seg = self._segments.get(name)
        if seg is None:
            out = c_uint64()
            _lib.call(lib.mc_engine_open_segment, self.handle, _lib.cstr(name), byref(out))
            seg = self._segments[name] = out.value
        return seg

    def close_segment(self, segment: Union[int, str]) -> None:
        """Forgets an opened segment (by id or name)."""
        if isinstance(segment, str):
            seg = self._segments.pop(segment, None)
            if seg is None:
                return
        else:
            seg = segment
            for k, v in list(self._segments.items()):
                if v == seg:
                    self._segments.pop(k, None)
        _lib.call(lib.mc_engine_close_segment, self.handle, seg)

    def segment_buffers(self, segment: Union[int, str]) -> List[Tuple[int, int]]:
        """The (address, length) of every buffer the segment published."""
        seg = self.open_segment(segment) if isinstance(segment, str) else segment
        n = c_size_t()
        e = _lib._err()
        arr = (_lib.BufferDesc * 8)()
        rc = lib.mc_engine_segment_buffers(self.handle, seg, arr, len(arr), byref(n), e)
        if rc == errors.BUFFER_TOO_SMALL:
            arr = (_lib.BufferDesc * n.value)()
            rc = lib.mc_engine_segment_buffers(self.handle, seg, arr, len(arr), byref(n), e)
        if rc != 0:
            raise _lib.error_from(e)
        return [(arr[i].addr, arr[i].length) for i in range(n.value)]

    # -- batches ---------------------------------------------------------

    def allocate_batch(self, capacity: int) -> int:
        """A batch id that holds up to ``capacity`` tasks over its life."""
        out = c_uint64()
        _lib.call(lib.mc_engine_allocate_batch, self.handle, capacity, byref(out))
        return out.value

    def free_batch(self, batch: int) -> None:
        """Releases a batch (:class:`~mooncake_go.errors.BatchBusy` while a task runs)."""
        _lib.call(lib.mc_engine_free_batch, self.handle, batch)

    def submit(self, batch: int, requests: Union[RequestArray, Sequence[Request]],
               notify: Optional[Tuple[str, str]] = None) -> None:
        """Starts requests as tasks of batch (all or none). With ``notify``
        = (name, msg), that notification is sent to the first request's
        segment once every task completed."""
        arr = requests if isinstance(requests, RequestArray) else RequestArray(requests)
        if notify is None:
            _lib.call(lib.mc_engine_submit, self.handle, batch, arr._ptr, arr.n)
        else:
            _lib.call(lib.mc_engine_submit_with_notify, self.handle, batch, arr._ptr, arr.n,
                      _lib.cstr(notify[0]), _lib.cstr(notify[1]))

    def task_status(self, batch: int, task: int) -> Status:
        st = _lib.TransferStatus()
        _lib.call(lib.mc_engine_task_status, self.handle, batch, task, byref(st))
        return Status(State(st.state), st.error_code, st.transferred)

    def batch_status(self, batch: int) -> Status:
        st = _lib.TransferStatus()
        _lib.call(lib.mc_engine_batch_status, self.handle, batch, byref(st))
        return Status(State(st.state), st.error_code, st.transferred)

    def wait(self, batch: int, timeout: Optional[float] = None) -> Status:
        """Blocks (without the GIL) until every task of batch is final;
        raises :class:`~mooncake_go.errors.TransferFailed` (or the failure's
        class) if one failed, :class:`~mooncake_go.errors.TimedOut` after
        ``timeout`` seconds."""
        st = _lib.TransferStatus()
        ms = -1 if timeout is None else int(timeout * 1000)
        _lib.call(lib.mc_engine_wait, self.handle, batch, ms, byref(st))
        return Status(State(st.state), st.error_code, st.transferred)

    def transfer(self, requests: Union[RequestArray, Sequence[Request]], timeout: Optional[float] = None,
                 notify: Optional[Tuple[str, str]] = None) -> None:
        """Runs requests as one batch and waits: allocate, submit, wait, free."""
        arr = requests if isinstance(requests, RequestArray) else RequestArray(requests)
        if arr.n == 0:
            return
        h = self.handle
        b = c_uint64()
        _lib.call(lib.mc_engine_allocate_batch, h, arr.n, byref(b))
        batch = b.value
        try:
            self.submit(batch, arr, notify)
            _lib.call(lib.mc_engine_wait, h, batch, -1 if timeout is None else int(timeout * 1000), None)
        except MooncakeError:
            # A batch whose tasks still run stays busy; the engine's close
            # fails and frees it.
            lib.mc_engine_free_batch(h, batch, None)
            raise
        _lib.call(lib.mc_engine_free_batch, h, batch)

    def write(self, segment: Union[int, str], local: Buffer, remote: int, length: Optional[int] = None,
              timeout: Optional[float] = None) -> None:
        """Copies local memory to ``remote`` in segment and waits."""
        seg = self.open_segment(segment) if isinstance(segment, str) else segment
        self.transfer([Request(Op.WRITE, local, seg, remote, length)], timeout)

    def read(self, segment: Union[int, str], local: Buffer, remote: int, length: Optional[int] = None,
             timeout: Optional[float] = None) -> None:
        """Copies ``remote`` in segment to local memory and waits."""
        seg = self.open_segment(segment) if isinstance(segment, str) else segment
        self.transfer([Request(Op.READ, local, seg, remote, length)], timeout)

    # -- notifications ---------------------------------------------------

    def send_notify(self, segment: Union[int, str], name: str, msg: str) -> None:
        """Delivers (name, msg) to the engine of an opened segment."""
        seg = self.open_segment(segment) if isinstance(segment, str) else segment
        _lib.call(lib.mc_engine_send_notify, self.handle, seg, _lib.cstr(name), _lib.cstr(msg))

    def get_notifies(self) -> List[Notify]:
        """Takes the notifications received so far, oldest first."""
        p = ctypes.POINTER(_lib.Notify)()
        n = c_size_t()
        _lib.call(lib.mc_engine_get_notifies, self.handle, byref(p), byref(n))
        try:
            return [Notify(ctypes.string_at(p[i].name, p[i].name_len).decode("utf-8", "replace"),
                           ctypes.string_at(p[i].msg, p[i].msg_len).decode("utf-8", "replace"))
                    for i in range(n.value)]
        finally:
            if n.value:
                lib.mc_notifies_free(p, n.value)

    # -- lifecycle -------------------------------------------------------

    def close(self) -> None:
        """Stops the engine (in-flight transfers fail). Idempotent.
        Registered memory stays the caller's."""
        super().close()

    def __repr__(self) -> str:
        if self.closed:
            return "<TransferEngine closed>"
        return f"<TransferEngine {self.name}>"


__all__ = ["TransferEngine", "Request", "RequestArray", "Op", "State", "Status", "Notify", "LOCAL_SEGMENT",
           "TransferFailed"]
