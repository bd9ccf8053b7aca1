"""Dummy clients: the thin, per-rank side of Mooncake's real/dummy split.

A real client (``mooncake client``, the official ``mooncake_client``) owns
a segment of the pool and the transfer engine; a :class:`DummyStore` in
each rank's process forwards to it over a unix socket and shares its pool::

    alloc_shared(1 << 30)                     # the rank's host KV pool (memfd)
    with DummyStore("127.0.0.1:50052", mem_pool_size=1 << 30) as d:
        d.register_buffer(pool_addr, 1 << 30) # the real client maps it too
        d.batch_put_from(keys, addrs, sizes)  # no copy: offsets travel, not bytes
        buf = d.alloc(4096)                   # or memory from the dummy's own pool

What moves without a copy: memory from :meth:`DummyStore.alloc` and memory
from :func:`alloc_shared` that was registered. Anything else is copied once
through the staging buffer (``local_buffer_size``); a value larger than it
is refused with InvalidParams. Values made of parts are gathered into one
copy. See docs/client-modes.md.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from ctypes import byref, c_int32, c_uint64, c_void_p
from typing import Dict, List, Optional, Sequence, Tuple

from . import _lib, errors
from ._buffers import Buffer, address, to_bytes_pointer
from .store import Replicate, Result, _code_error, _keys, _rc, _resolve_many, _results, _WHOLE_CALL_FAILURES

lib = _lib.lib

# The staging buffer of a dummy whose local_buffer_size is 0.
DEFAULT_STAGING = 16 << 20

# -- shareable host memory ---------------------------------------------------

_shared_lock = threading.Lock()
_shared: Dict[int, Tuple[int, int, mmap.mmap]] = {}  # base address -> (memfd, size, mapping)
# base address -> the dummies that registered it, which free_shared makes
# forget it: else a dummy would go on naming the freed range as the old
# region, and memory mapped there later would move the freed pages.
_registrations: Dict[int, "weakref.WeakSet[DummyStore]"] = {}


def alloc_shared(size: int) -> int:
    """The address of ``size`` bytes of zeroed, page-aligned memory backed
    by a memfd, which a dummy client can share with its real client
    (:meth:`DummyStore.register_buffer`); 0 on failure."""
    size = int(size)
    if size <= 0:
        return 0
    try:
        # Sealable: a real client that maps it seals it against shrinking,
        # so that no stray ftruncate cuts pages from under it (SIGBUS).
        fd = os.memfd_create("mooncake-host-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        return 0
    try:
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError):
        os.close(fd)
        return 0
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    with _shared_lock:
        _shared[addr] = (fd, size, m)
    return addr


def free_shared(addr: int) -> bool:
    """Frees memory from :func:`alloc_shared`, unregistering it first from
    the dummies that registered it; False for an address it did not
    return, or while a view of the memory (a tensor made from it, say) is
    alive (it stays allocated, but no longer registered)."""
    with _shared_lock:
        entry = _shared.pop(int(addr), None)
        holders = list(_registrations.pop(int(addr), ())) if entry is not None else []
    if entry is None:
        return False
    for d in holders:
        d._forget(int(addr))
    fd, size, m = entry
    try:
        m.close()
    except BufferError:
        with _shared_lock:
            _shared[int(addr)] = entry
        return False
    os.close(fd)
    return True


def shared_region(addr: int) -> Optional[Tuple[int, int, int]]:
    """(base, memfd, size) of the :func:`alloc_shared` memory that holds
    ``addr``, or None."""
    addr = int(addr)
    with _shared_lock:
        for base, (fd, size, _) in _shared.items():
            if base <= addr < base + size:
                return base, fd, size
    return None


def _invalid(msg: str) -> errors.MooncakeError:
    return errors.from_status(-600, errors.DOMAIN_STORE, "INVALID_PARAMS", msg)


class DummyStore(_lib.Owned):
    """A dummy client of the real client at ``server_address`` (``"host:port"``
    with the port of ``mooncake client --port``, 50052 by default; or a
    unix socket path or ``"@abstract-name"``). It asks for ``mem_pool_size``
    bytes of pool (:meth:`alloc`) and ``local_buffer_size`` bytes of staging
    buffer [16 MiB], both memory shared with the real client.

    The methods are :class:`~mooncake_go.Store`'s, with the same results;
    sessions, ranges, replica lists and regex removal raise InvalidParams
    (a dummy forwards the bytes API only). When the real client dies,
    calls raise RpcFail at once."""

    def __init__(self, server_address: str, *, mem_pool_size: int = 0, local_buffer_size: int = 0):
        out = c_uint64()
        staging = int(local_buffer_size) if int(local_buffer_size) > 0 else DEFAULT_STAGING
        _lib.call(lib.mc_dummy_create, _lib.cstr(server_address), max(int(mem_pool_size), 0), staging, byref(out))
        self._own(out.value, lib.mc_dummy_close)
        self._address = server_address
        self._registered: Dict[int, int] = {}  # base of a registered alloc_shared region -> size

    @property
    def name(self) -> str:
        return f"dummy@{self._address}"

    hostname = name

    # -- memory ----------------------------------------------------------

    def alloc(self, size: int) -> int:
        """The address of ``size`` bytes of the dummy's pool (4096-aligned):
        memory the real client reads and writes directly. Raises
        NoAvailableHandle when the pool is full."""
        out = c_void_p()
        _lib.call(lib.mc_dummy_alloc, self.handle, int(size), byref(out))
        return out.value or 0

    def free(self, addr: int) -> None:
        _lib.call(lib.mc_dummy_free, self.handle, int(addr))

    def register_buffer(self, buf: Buffer, length: Optional[int] = None) -> int:
        """Shares the :func:`alloc_shared` memory that holds buf with the
        real client (the whole allocation, once), so that puts from and
        gets into it copy nothing. Other memory needs no registration: it
        travels through staging. Returns buf's address."""
        addr, _ = address(buf, length)
        r = shared_region(addr)
        if r is not None and r[0] not in self._registered:
            base, fd, size = r
            _lib.call(lib.mc_dummy_register_shared, self.handle, fd, 0, base, size)
            self._registered[base] = size
            with _shared_lock:
                _registrations.setdefault(base, weakref.WeakSet()).add(self)
        return addr

    def unregister_buffer(self, buf: Buffer) -> None:
        addr = int(buf if isinstance(buf, int) else address(buf)[0])
        if self._registered.pop(addr, None) is not None:
            with _shared_lock:
                holders = _registrations.get(addr)
                if holders is not None:
                    holders.discard(self)
            _lib.call(lib.mc_dummy_unregister_shared, self.handle, addr)

    def _forget(self, base: int) -> None:
        """Unregisters base as free_shared frees it; a dummy that is closed
        or whose real client is gone has nothing to undo there."""
        if self._registered.pop(base, None) is None or self.closed:
            return
        try:
            _lib.call(lib.mc_dummy_unregister_shared, self.handle, base)
        except errors.MooncakeError:
            pass  # the region is dropped on this side whatever the answer

    # -- batches ---------------------------------------------------------

    def _put_codes(self, upsert: bool, keys: Sequence[str], addrs, lengths, replicate) -> List[int]:
        n = len(keys)
        if len(addrs) != n or len(lengths) != n:
            raise ValueError("keys, buffers and sizes differ in number")
        if n == 0:
            return []
        codes = (c_int32 * n)()
        rc = lib.mc_dummy_batch_put(self.handle, _keys(keys), (c_void_p * n)(*addrs), (c_uint64 * n)(*lengths), n,
                                    int(upsert), _rc(replicate), codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(codes)

    def _values_codes(self, upsert: bool, keys, values, replicate) -> List[int]:
        held = [to_bytes_pointer(v) for v in values]  # alive over the call
        addrs = [ctypes.cast(ctypes.c_char_p(p), c_void_p).value or 0 if isinstance(p, bytes) else p for p, _ in held]
        return self._put_codes(upsert, keys, addrs, [m for _, m in held], replicate)

    def _get_codes(self, keys: Sequence[str], addrs, lengths) -> Tuple[List[int], List[int]]:
        n = len(keys)
        if len(addrs) != n or len(lengths) != n:
            raise ValueError("keys, buffers and sizes differ in number")
        if n == 0:
            return [], []
        codes, outs = (c_int32 * n)(), (c_uint64 * n)()
        rc = lib.mc_dummy_batch_get_into(self.handle, _keys(keys), (c_void_p * n)(*addrs), (c_uint64 * n)(*lengths),
                                         n, outs, codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(codes), list(outs)

    def batch_put(self, keys: Sequence[str], values: Sequence, replicate: Optional[Replicate] = None) -> List[Result]:
        return _results(self._values_codes(False, keys, values, replicate))

    def batch_upsert(self, keys: Sequence[str], values: Sequence, replicate: Optional[Replicate] = None) -> List[Result]:
        return _results(self._values_codes(True, keys, values, replicate))

    def batch_put_from(self, keys: Sequence[str], bufs: Sequence[Buffer], lengths: Optional[Sequence[int]] = None,
                       replicate: Optional[Replicate] = None) -> List[Result]:
        addrs, lens = _resolve_many(bufs, lengths, writable=False)
        return _results(self._put_codes(False, keys, addrs, lens, replicate))

    def batch_upsert_from(self, keys: Sequence[str], bufs: Sequence[Buffer], lengths: Optional[Sequence[int]] = None,
                          replicate: Optional[Replicate] = None) -> List[Result]:
        addrs, lens = _resolve_many(bufs, lengths, writable=False)
        return _results(self._put_codes(True, keys, addrs, lens, replicate))

    def batch_get_into(self, keys: Sequence[str], bufs: Sequence[Buffer],
                       lengths: Optional[Sequence[int]] = None) -> List[Result]:
        addrs, lens = _resolve_many(bufs, lengths, writable=True)
        codes, outs = self._get_codes(keys, addrs, lens)
        return [o if c == 0 else _code_error(c) for c, o in zip(codes, outs)]

    def batch_put_from_parts(self, keys: Sequence[str], parts: Sequence[Sequence[Buffer]],
                             sizes: Optional[Sequence[Sequence[int]]] = None,
                             replicate: Optional[Replicate] = None) -> List[Result]:
        """Each value gathered from its parts (one copy), then put."""
        if len(parts) != len(keys) or (sizes is not None and len(sizes) != len(keys)):
            raise ValueError("keys, part lists and size lists differ in number")
        values = []
        for i, ps in enumerate(parts):
            ns = sizes[i] if sizes is not None else [None] * len(ps)
            if len(ns) != len(ps):
                values.append(None)
                continue
            values.append(b"".join(ctypes.string_at(*address(p, m)) for p, m in zip(ps, ns)))
        send = [i for i, v in enumerate(values) if v is not None]
        out: List[Result] = [_invalid(f"key {k!r}: parts and sizes differ in number") for k in keys]
        for i, r in zip(send, self.batch_put([keys[i] for i in send], [values[i] for i in send], replicate)):
            out[i] = r
        return out

    def batch_get_into_parts(self, keys: Sequence[str], parts: Sequence[Sequence[Buffer]],
                             sizes: Optional[Sequence[Sequence[int]]] = None) -> List[Result]:
        """Each value read once, then scattered over its parts (one copy)."""
        if len(parts) != len(keys) or (sizes is not None and len(sizes) != len(keys)):
            raise ValueError("keys, part lists and size lists differ in number")
        out: List[Result] = []
        for i, k in enumerate(keys):
            ns = sizes[i] if sizes is not None else [None] * len(parts[i])
            if len(ns) != len(parts[i]):
                out.append(_invalid(f"key {k!r}: parts and sizes differ in number"))
                continue
            dsts = [address(p, m, writable=True) for p, m in zip(parts[i], ns)]
            try:
                v = self.get(k)
            except errors.MooncakeError as e:
                out.append(e)
                continue
            if len(v) > sum(m for _, m in dsts):
                out.append(_invalid(f"key {k!r}: {len(v)} bytes do not fit its parts"))
                continue
            pos = 0
            for a, m in dsts:
                chunk = v[pos:pos + m]
                ctypes.memmove(a, chunk, len(chunk))
                pos += len(chunk)
            out.append(len(v))
        return out

    def batch_exists(self, keys: Sequence[str], *, raise_on_error: bool = True):
        n = len(keys)
        if n == 0:
            return []
        ex, codes = (c_int32 * n)(), (c_int32 * n)()
        rc = lib.mc_dummy_batch_exist(self.handle, _keys(keys), n, ex, codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        if raise_on_error:
            for c in codes:
                if c != 0:
                    raise _code_error(c)
        return [x == 1 if c == 0 else _code_error(c) for x, c in zip(ex, codes)]

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> List[Result]:
        n = len(keys)
        if n == 0:
            return []
        codes = (c_int32 * n)()
        rc = lib.mc_dummy_batch_remove(self.handle, _keys(keys), n, int(force), codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return _results(list(codes))

    # -- single objects --------------------------------------------------

    @staticmethod
    def _one(results: List[Result]):
        if isinstance(results[0], errors.MooncakeError):
            raise results[0]
        return results[0]

    def put(self, key: str, value, replicate: Optional[Replicate] = None) -> None:
        self._one(self.batch_put([key], [value], replicate))

    def upsert(self, key: str, value, replicate: Optional[Replicate] = None) -> None:
        self._one(self.batch_upsert([key], [value], replicate))

    def put_from(self, key: str, buf: Buffer, length: Optional[int] = None,
                 replicate: Optional[Replicate] = None) -> None:
        self._one(self.batch_put_from([key], [buf], None if length is None else [length], replicate))

    def upsert_from(self, key: str, buf: Buffer, length: Optional[int] = None,
                    replicate: Optional[Replicate] = None) -> None:
        self._one(self.batch_upsert_from([key], [buf], None if length is None else [length], replicate))

    def get_size(self, key: str) -> int:
        out = c_uint64()
        _lib.call(lib.mc_dummy_get_size, self.handle, _lib.cstr(key), byref(out))
        return out.value

    def get_into(self, key: str, buf: Buffer, length: Optional[int] = None) -> int:
        return self._one(self.batch_get_into([key], [buf], None if length is None else [length]))

    def get(self, key: str) -> bytes:
        """The value of key: its size, then its bytes (through staging)."""
        n = self.get_size(key)
        if n == 0:
            return b""
        buf = ctypes.create_string_buffer(n)
        got = self.get_into(key, ctypes.addressof(buf), n)
        return buf.raw[:got]

    def exists(self, key: str) -> bool:
        return self.batch_exists([key])[0]

    def remove(self, key: str, force: bool = False) -> None:
        self._one(self.batch_remove([key], force))

    def remove_all(self, force: bool = False) -> int:
        out = c_uint64()
        _lib.call(lib.mc_dummy_remove_all, self.handle, int(force), byref(out))
        return out.value

    def _unsupported(self, *args, **kwargs):
        raise _invalid("not available on a dummy client: it forwards the bytes API to its real client only")

    remove_by_regex = replicas = get_session_start = get_session_end = _unsupported
    put_session_start = put_session_end = put_session_revoke = _unsupported
    batch_put_ranges = batch_get_ranges = _unsupported

    def close(self) -> None:
        """Hangs up: the real client frees the memory it shared with this
        dummy (objects put stay in the pool). Idempotent."""
        super().close()

    def __repr__(self) -> str:
        return "<DummyStore closed>" if self.closed else f"<DummyStore of {self._address}>"


__all__ = ["DummyStore", "alloc_shared", "free_shared", "shared_region", "DEFAULT_STAGING"]
