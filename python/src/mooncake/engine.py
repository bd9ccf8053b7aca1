"""mooncake.engine: Mooncake's Python Transfer Engine API on mooncake-go.

Same class, method names, positional and keyword arguments and integer
return codes as the official ``mooncake.engine`` module, so vLLM's
MooncakeConnector and SGLang's mooncake transfer backend import it
unchanged::

    from mooncake.engine import TransferEngine
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    session = f"127.0.0.1:{te.get_rpc_port()}"
    te.batch_register_memory(ptrs, lens)
    te.batch_transfer_sync_write(peer_session, src_ptrs, dst_ptrs, lens)   # 0 = ok

Methods return 0 (or a value) on success and a negative code on failure,
never raise for a transfer or registration failure, as the original.

Differences: ``protocol`` "tcp" selects TCP; any other value ("rdma", ...)
lets the engine choose (shared memory to same-host mooncake-go peers, TCP
elsewhere). ``device_name`` is accepted and ignored (no RDMA devices).
"""

from __future__ import annotations

import enum
import ipaddress
import json
import socket
import threading
from typing import List, Optional

import mooncake_go
from mooncake_go.engine import Op, RequestArray, State
from mooncake_go.errors import MooncakeError

SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_MNNVL = False

_ERR_INVALID_ARGUMENT = -1
_ERR_CONTEXT = -202  # not initialized / closed


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification: sent with a transfer (transfer_sync(..., notify=))
    or received (get_notifies())."""

    def __init__(self, name: str = "", msg: str = ""):
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


def _code(e: MooncakeError) -> int:
    """The negative code a compat method returns for an error."""
    return e.code if e.code < 0 else -1


def _host_of(local_hostname: str) -> Optional[str]:
    """The IP peers reach us at, from Mooncake's local_hostname
    ("ip", "ip:port", "name", "name:port")."""
    host = local_hostname
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if not host:
        return None
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


class TransferEngine:
    """Mooncake's ``mooncake.engine.TransferEngine`` over mooncake-go."""

    TransferOpcode = TransferOpcode  # also reachable from the class, as the official one's

    def __init__(self):
        self._engine: Optional[mooncake_go.TransferEngine] = None
        self._managed = {}  # addr -> SharedBuffer
        self._async = {}  # batch id -> number of tasks, for async calls
        self._lock = threading.Lock()

    # -- setup -----------------------------------------------------------

    def initialize(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        """Starts the engine; 0 on success. ``metadata_server`` is
        "P2PHANDSHAKE", "etcd://h:p", "h:p" (etcd) or "http://h:p/metadata"."""
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str, device_name: str,
                       metadata_type: str) -> int:
        if self._engine is not None:
            return _ERR_INVALID_ARGUMENT
        meta = metadata_server or "P2PHANDSHAKE"
        if meta != "P2PHANDSHAKE" and "://" not in meta:
            meta = f"{metadata_type or 'etcd'}://{meta}"
        transport = "tcp" if (protocol or "").lower() == "tcp" else None
        try:
            self._engine = mooncake_go.TransferEngine(
                metadata=meta, local_server_name=local_hostname or None,
                host=_host_of(local_hostname) if local_hostname else None, transport=transport)
        except MooncakeError as e:
            return _code(e)
        return 0

    def get_rpc_port(self) -> int:
        """The handshake port: the session name is f"{host}:{get_rpc_port()}"."""
        try:
            return self._e().rpc_port
        except MooncakeError as e:
            return _code(e)

    def get_engine(self) -> "mooncake_go.TransferEngine":
        """The native engine (pass it to MooncakeDistributedStore.setup(engine=))."""
        return self._e()

    def get_engine_ptr(self) -> int:
        """The engine's C ABI handle (an integer, not a pointer)."""
        return self._e().handle

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """No RDMA devices: an empty topology."""
        return json.dumps({})

    # -- memory ----------------------------------------------------------

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        try:
            self._e().register_memory(int(buffer_addr), int(capacity), location=location or "*")
            return 0
        except MooncakeError as e:
            return _code(e)

    def unregister_memory(self, buffer_addr: int) -> int:
        try:
            self._e().unregister_memory(int(buffer_addr))
            return 0
        except MooncakeError as e:
            return _code(e)

    def batch_register_memory(self, buffer_addresses: List[int], capacities: List[int], location: str = "*") -> int:
        if len(buffer_addresses) != len(capacities):
            return _ERR_INVALID_ARGUMENT
        for i, (a, n) in enumerate(zip(buffer_addresses, capacities)):
            rc = self.register_memory(a, n, location)
            if rc != 0:
                for b in buffer_addresses[:i]:  # all or nothing
                    self.unregister_memory(b)
                return rc
        return 0

    def batch_unregister_memory(self, buffer_addresses: List[int]) -> int:
        rc = 0
        for a in buffer_addresses:
            r = self.unregister_memory(a)
            rc = rc or r
        return rc

    def allocate_managed_buffer(self, length: int) -> int:
        """Engine-allocated registered memory; its address, or 0."""
        try:
            b = self._e().allocate_buffer(int(length))
        except MooncakeError:
            return 0
        with self._lock:
            self._managed[b.addr] = b
        return b.addr

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        with self._lock:
            b = self._managed.pop(int(buffer_addr), None)
        if b is None:
            return _ERR_INVALID_ARGUMENT
        try:
            b.free()
            return 0
        except MooncakeError as e:
            return _code(e)

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes, length: int) -> int:
        """Copies ``length`` bytes of src_ptr (bytes or str) to dest_address."""
        import ctypes

        data = src_ptr.encode() if isinstance(src_ptr, str) else bytes(src_ptr)
        if length > len(data):
            return _ERR_INVALID_ARGUMENT
        ctypes.memmove(int(dest_address), data, int(length))
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        import ctypes

        return ctypes.string_at(int(source_address), int(length))

    def get_first_buffer_address(self, segment_name: str) -> int:
        """Address of the first buffer segment_name published, or 0."""
        try:
            bufs = self._e().segment_buffers(segment_name)
        except MooncakeError:
            return 0
        return bufs[0][0] if bufs else 0

    # -- synchronous transfers -------------------------------------------

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                            transport_hint: str = "") -> int:
        return self._sync(target_hostname, [buffer], [peer_buffer_address], [length], Op.WRITE)

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                           transport_hint: str = "") -> int:
        return self._sync(target_hostname, [buffer], [peer_buffer_address], [length], Op.READ)

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                      opcode: TransferOpcode, notify: Optional[TransferNotify] = None, transport_hint: str = "") -> int:
        return self._sync(target_hostname, [buffer], [peer_buffer_address], [length], Op(int(opcode)), notify)

    def batch_transfer_sync_write(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int],
                                  lengths: List[int], transport_hint: str = "") -> int:
        return self._sync(target_hostname, buffers, peer_buffer_addresses, lengths, Op.WRITE)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int],
                                 lengths: List[int], transport_hint: str = "") -> int:
        return self._sync(target_hostname, buffers, peer_buffer_addresses, lengths, Op.READ)

    def batch_transfer_sync(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int],
                            lengths: List[int], opcode: TransferOpcode, notify: Optional[TransferNotify] = None,
                            transport_hint: str = "") -> int:
        return self._sync(target_hostname, buffers, peer_buffer_addresses, lengths, Op(int(opcode)), notify)

    def _sync(self, target, buffers, peers, lengths, op, notify=None) -> int:
        """Submits one batch and waits; 0 or a negative code."""
        eng = self._engine
        if eng is None:
            return _ERR_CONTEXT
        n = len(buffers)
        if n == 0:
            return 0
        try:
            seg = eng.open_segment(target)
            arr = RequestArray.of(op, seg, buffers, peers, lengths)
        except MooncakeError as e:
            return _code(e)
        except (ValueError, TypeError, OverflowError):
            return _ERR_INVALID_ARGUMENT
        try:
            eng.transfer(arr, notify=None if notify is None else (notify.name, notify.msg))
        except MooncakeError as e:
            return _clamp(e.code)
        return 0

    # -- asynchronous transfers ------------------------------------------

    def batch_transfer_async_write(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int],
                                   lengths: List[int], transport_hint: str = "") -> int:
        return self._async_submit(target_hostname, buffers, peer_buffer_addresses, lengths, Op.WRITE)

    def batch_transfer_async_read(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int],
                                  lengths: List[int], transport_hint: str = "") -> int:
        return self._async_submit(target_hostname, buffers, peer_buffer_addresses, lengths, Op.READ)

    def batch_transfer_async(self, target_hostname: str, buffers: List[int], peer_buffer_addresses: List[int],
                             lengths: List[int], opcode: TransferOpcode, transport_hint: str = "") -> int:
        return self._async_submit(target_hostname, buffers, peer_buffer_addresses, lengths, Op(int(opcode)))

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                              transport_hint: str = "") -> int:
        """Starts one write; its batch id (0 on failure), for transfer_check_status."""
        return self._async_submit(target_hostname, [buffer], [peer_buffer_address], [length], Op.WRITE)

    def _async_submit(self, target, buffers, peers, lengths, op) -> int:
        """Submits a batch without waiting; its id, or 0 on failure."""
        eng = self._engine
        if eng is None or not buffers:
            return 0
        try:
            seg = eng.open_segment(target)
            arr = RequestArray.of(op, seg, buffers, peers, lengths)
            batch = eng.allocate_batch(len(buffers))
        except (MooncakeError, ValueError, TypeError, OverflowError):
            return 0
        try:
            eng.submit(batch, arr)
        except MooncakeError:
            _free(eng, batch)
            return 0
        return batch

    def get_batch_transfer_status(self, batch_ids: List[int]) -> int:
        """Waits for every batch of batch_ids and frees them; 0 when all
        completed, else a negative code."""
        eng = self._engine
        if eng is None:
            return _ERR_CONTEXT
        rc = 0
        for b in batch_ids:
            try:
                eng.wait(int(b))
                r = 0
            except MooncakeError as e:
                r = e.code
            _free(eng, int(b))
            rc = rc or _clamp(r)
        return rc

    def transfer_check_status(self, batch_id: int) -> int:
        """1 done, 0 pending, -1 failed, -2 timed out; a final batch is freed."""
        eng = self._engine
        if eng is None:
            return -1
        try:
            state = eng.batch_status(int(batch_id)).state
        except MooncakeError:
            return -1
        if state in (State.WAITING, State.PENDING):
            return 0
        _free(eng, int(batch_id))
        if state == State.COMPLETED:
            return 1
        return -2 if state == State.TIMEOUT else -1

    # -- notifications and probes ----------------------------------------

    def get_notifies(self) -> List[TransferNotify]:
        eng = self._engine
        if eng is None:
            return []
        try:
            return [TransferNotify(n.name, n.msg) for n in eng.get_notifies()]
        except MooncakeError:
            return []

    def send_probe(self, peer_server_name: str) -> int:
        """0 when the peer answers its handshake, else a negative code."""
        eng = self._engine
        if eng is None:
            return _ERR_CONTEXT
        try:
            # Forget a cached id so that the probe reaches the peer.
            eng.close_segment(peer_server_name)
            eng.open_segment(peer_server_name)
            return 0
        except MooncakeError as e:
            return _code(e)

    def warmup_efa_segment(self, segment_name: str) -> int:
        return 0

    # -- extras (not in the official API) --------------------------------

    def close(self) -> None:
        """Stops the engine (the official object stops it when collected)."""
        eng, self._engine = self._engine, None
        if eng is not None:
            for b in list(self._managed.values()):
                try:
                    b.free()
                except MooncakeError:
                    pass
            self._managed.clear()
            eng.close()

    def _e(self) -> "mooncake_go.TransferEngine":
        if self._engine is None:
            raise mooncake_go.errors.EngineClosed(_ERR_CONTEXT, message="TransferEngine is not initialized")
        return self._engine


def _free(eng: "mooncake_go.TransferEngine", batch: int) -> None:
    """Frees batch, as the official bindings do, without a word on failure
    (a batch still busy stays allocated until the engine closes)."""
    try:
        eng.free_batch(batch)
    except MooncakeError:
        pass


def _clamp(rc: int) -> int:
    """ABI codes below the engine's table become -1 (the official
    bindings return -1 for any failed transfer)."""
    if rc == 0:
        return 0
    return rc if rc > -9000 else -1


__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write"]
