"""The Store client: this process's share of a distributed KV-cache pool.

Lifecycle::

    with Store("127.0.0.1:50051", segment_size=256 << 20) as st:   # joins the pool
        st.put("k", b"value")
        assert st.get("k") == b"value"
        st.register_buffer(arr)                     # zero-copy from/to arr
        st.put_from("k2", arr)
        n = st.get_into("k2", out)
        st.batch_put_from_parts(["k3"], [[layer0, layer1]])   # one value, two buffers
        st.batch_get_into_parts(["k3"], [[out0, out1]])

Failures raise :class:`~mooncake_go.errors.MooncakeError` subclasses
(``ObjectNotFound``, ``NoAvailableHandle``, ...). Puts are write-once: a
put of a key that exists raises ``ObjectAlreadyExists`` and leaves the
value as it is (``upsert`` replaces it; a store opened with
``exist_ok=True`` lets such a put succeed without writing, as Mooncake's
put does). Batch calls return one
result per key instead of raising: ``None`` (or a length) for a success,
the exception for a failure. Calls release the GIL; one store may be used
from many threads at once.
"""

from __future__ import annotations

import array
import ctypes
import os
from ctypes import byref, c_char_p, c_int32, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

from . import _lib, errors
from ._buffers import Buffer, address, to_bytes_pointer
from .engine import TransferEngine

lib = _lib.lib
Result = Union[None, int, errors.MooncakeError]
# A piece of a value: (offset in the value, buffer) or (offset, buffer, length).
Range = Union[Tuple[int, Buffer], Tuple[int, Buffer, int]]


@dataclass
class Replicate:
    """How a put is replicated and protected (Mooncake's ReplicateConfig).

    :param replicas: memory replicas, each on a distinct segment [1].
    :param soft_pin: keep through eviction until ``soft_pin_ttl_ms``
        [master's default] passes. ``hard_pin``: never evict.
    :param prefer_local: place on this host first.
    :param preferred_segments: segment names to place replicas on first.
    :param stripe_count: pieces each replica is cut into, on distinct
        segments, read in parallel by a get (1: none) [0: the master's
        policy]. Needs ABI 1.11: an older library refuses a put that asks
        for stripes.
    """

    replicas: int = 1
    soft_pin: bool = False
    hard_pin: bool = False
    soft_pin_ttl_ms: int = 0
    prefer_local: bool = False
    preferred_segments: Sequence[str] = field(default_factory=tuple)
    stripe_count: int = 0

    def _c(self):
        """The C struct (and what must stay alive with it)."""
        rc = _lib.ReplicateConfig()
        rc.struct_size = ctypes.sizeof(rc)
        rc.replicas = max(int(self.replicas), 0)
        rc.soft_pin, rc.hard_pin = int(bool(self.soft_pin)), int(bool(self.hard_pin))
        rc.soft_pin_ttl_ms = int(self.soft_pin_ttl_ms or 0)
        rc.prefer_local = int(bool(self.prefer_local))
        if not 0 <= int(self.stripe_count) <= 0x7FFFFFFF:
            raise ValueError(f"stripe_count {self.stripe_count} out of range")
        rc.stripe_count = int(self.stripe_count)
        segs = [s for s in self.preferred_segments if s]
        if segs:
            arr = (c_char_p * len(segs))(*[s.encode() for s in segs])
            rc.n_preferred = len(segs)
            rc.preferred_segments = ctypes.cast(arr, ctypes.POINTER(c_char_p))
            rc._keep = arr  # type: ignore[attr-defined]
        return rc


def _keys(keys: Sequence[str]):
    if isinstance(keys, ctypes.Array):  # a caller's own (c_char_p * n), built once for its batch
        return keys
    return (c_char_p * max(len(keys), 1))(*[_lib.cstr(k) for k in keys])


class Store(_lib.Owned):
    """A store client connected to the master at ``master``
    (``"host:port"``, or ``"etcd://h1:2379;h2:2379"`` to follow the HA
    leader). Zero/None arguments mean the library's default [in brackets].

    :param segment_size: bytes this client contributes to the pool
        [512 MiB]; ``-1`` for none (a client that only reads and writes).
    :param local_buffer_size: staging memory for unregistered buffers [128 MiB].
    :param local_hostname: the address peers reach the engine at,
        ``"host"`` or ``"host:port"`` (the handshake port) [as the engine
        picks].
    :param metadata: the engine's metadata service [P2PHANDSHAKE].
    :param protocol: ``"tcp"`` [default] and ``"rdma"`` (no hardware here)
        both mean shared memory with peers on this host, TCP elsewhere;
        ``"shm"`` keeps to shared memory.
    :param replicas: default replicas per put [1].
    :param cluster_id: HA cluster name in etcd [MC_STORE_CLUSTER_ID or
        "mooncake_cluster"].
    :param rpc_timeout_ms: per master call [30 s].
    :param op_timeout_ms: per call of this store, everything included
        (master, transfers, retries); past it the call fails with
        :class:`~mooncake_go.errors.TimedOut` [none: each step's own
        timeout]. Closing the store cancels calls in progress
        (:class:`~mooncake_go.errors.Canceled`).
    :param engine: a :class:`TransferEngine` to move bytes with (it must
        outlive the store) [the store starts its own].
    :param checksum: CRC-32C on put and check on get [True].
    :param exist_ok: a put (``put``, ``put_from``, the batch puts and
        puts of parts; not an upsert) of a key that exists succeeds
        without writing, as Mooncake's put, instead of failing with
        :class:`~mooncake_go.errors.ObjectAlreadyExists` [False]. A
        library older than ABI 1.7 cannot tell: there it is always True.
    :param auth_token: the bearer token a master started with
        ``--auth_token`` requires, also shown to an HTTP metadata server
        [the environment's MC_AUTH_TOKEN, else none].
    :param tls_ca_file: a PEM CA bundle verifying the master: TLS on
        [plaintext].
    :param tls_cert_file, tls_key_file: the client certificate a master
        with mutual TLS (``--tls_client_ca_file``) requires [none].
    :param te_secret: the Transfer Engine's shared secret, which every
        peer must know (``mooncake up --secure`` writes one), for the engine
        the store starts [the environment's MC_TE_SECRET, else none].
        These five need ABI 1.8; an older library raises ValueError.
    :param tls_server_name: the name the master's certificate must carry,
        where it is not the host dialed: a Kubernetes Service's name for
        masters reached at their pods' addresses [the host of ``master``,
        or of the leader etcd names]. It needs TLS on (``tls_ca_file`` or
        a client certificate) and ABI 1.12; an older library raises
        ValueError.
    :param tenant_id: the tenant whose objects this store puts and sees
        (Mooncake's ``tenant_id``; docs/tenants.md): two tenants never see
        each other's objects, even under the same key, and the master
        holds each to its quota [the environment's MOONCAKE_TENANT_ID, else
        "default"]. It needs ABI 1.10; an older library raises ValueError
        for a tenant other than "default".
    """

    def __init__(
        self,
        master: str,
        *,
        segment_size: int = 0,
        local_buffer_size: int = 0,
        local_hostname: Optional[str] = None,
        metadata: Optional[str] = None,
        protocol: Optional[str] = None,
        replicas: int = 0,
        cluster_id: Optional[str] = None,
        rpc_timeout_ms: int = 0,
        op_timeout_ms: int = 0,
        engine: Optional[TransferEngine] = None,
        checksum: bool = True,
        exist_ok: bool = False,
        auth_token: Optional[str] = None,
        tls_ca_file: Optional[str] = None,
        tls_cert_file: Optional[str] = None,
        tls_key_file: Optional[str] = None,
        te_secret: Optional[str] = None,
        tenant_id: Optional[str] = None,
        tls_server_name: Optional[str] = None,
    ):
        cfg = _lib.StoreConfig()
        cfg.struct_size = ctypes.sizeof(cfg)
        cfg.replicas = replicas
        cfg.master = _lib.cstr(master)
        cfg.local_hostname = _lib.cstr(local_hostname)
        cfg.metadata = _lib.cstr(metadata)
        cfg.protocol = _lib.cstr(protocol)
        cfg.cluster_id = _lib.cstr(cluster_id)
        cfg.segment_size = segment_size
        cfg.local_buffer_size = local_buffer_size
        cfg.rpc_timeout_ms = rpc_timeout_ms
        cfg.op_timeout_ms = op_timeout_ms
        cfg.engine = engine.handle if engine is not None else 0
        cfg.no_checksum = 0 if checksum else 1
        if lib.mc_abi_version() & 0xFFFF >= _REPORT_EXISTING_MINOR:
            cfg.report_existing = 0 if exist_ok else 1
        creds = (auth_token, tls_ca_file, tls_cert_file, tls_key_file, te_secret)
        if lib.mc_abi_version() & 0xFFFF >= _CREDENTIALS_MINOR:
            # Read here, not by the library: Go reads its environment once,
            # when it is loaded, and misses what the process set after.
            if auth_token is None:
                auth_token = os.environ.get("MC_AUTH_TOKEN") or None
            cfg.auth_token = _lib.cstr(auth_token)
            cfg.tls_ca_file = _lib.cstr(tls_ca_file)
            cfg.tls_cert_file = _lib.cstr(tls_cert_file)
            cfg.tls_key_file = _lib.cstr(tls_key_file)
            if te_secret is None:
                te_secret = os.environ.get("MC_TE_SECRET") or None
            cfg.te_secret = _lib.cstr(te_secret)
        elif any(c is not None for c in creds):
            raise ValueError("auth_token, tls_* and te_secret: the library is older than ABI 1.8 and cannot present credentials")
        if lib.mc_abi_version() & 0xFFFF >= _SERVER_NAME_MINOR:
            cfg.tls_server_name = _lib.cstr(tls_server_name)
        elif tls_server_name is not None:
            raise ValueError("tls_server_name: the library is older than ABI 1.12 and verifies the host dialed")
        if tenant_id is None:
            tenant_id = os.environ.get("MOONCAKE_TENANT_ID") or None
        if lib.mc_abi_version() & 0xFFFF >= _TENANT_MINOR:
            cfg.tenant_id = _lib.cstr(tenant_id)
        elif tenant_id not in (None, "default"):
            raise ValueError(f"tenant_id {tenant_id!r}: the library is older than ABI 1.10 and has no tenants")
        # get's first guess at a value's size: the last value it read.
        self._get_hint = _GET_HINT_MIN
        h = c_uint64()
        _lib.call(lib.mc_store_create, byref(cfg), byref(h))
        self._own(h.value, lib.mc_store_close)
        self._engine = engine  # kept alive: it must outlive the store

    @property
    def name(self) -> str:
        """This client's segment name (Mooncake's get_hostname)."""
        return _lib.read_string(lib.mc_store_name, self.handle)

    hostname = name

    # -- buffers ---------------------------------------------------------

    def register_buffer(self, buf: Buffer, length: Optional[int] = None) -> int:
        """Registers buf for zero-copy put_from/get_into; returns its
        address. Keep buf alive until unregistered or the store closes."""
        addr, n = address(buf, length)
        _lib.call(lib.mc_store_register_buffer, self.handle, addr, n)
        return addr

    def unregister_buffer(self, buf: Buffer) -> None:
        addr = buf if isinstance(buf, int) else address(buf)[0]
        _lib.call(lib.mc_store_unregister_buffer, self.handle, addr)

    # -- single objects --------------------------------------------------

    def put(self, key: str, value, replicate: Optional[Replicate] = None) -> None:
        """Stores value (bytes-like, any memory) under key, write-once: a
        key that exists raises ObjectAlreadyExists, its value unchanged
        (unless the store has ``exist_ok``)."""
        p, n = to_bytes_pointer(value)
        _lib.call(lib.mc_store_put, self.handle, _lib.cstr(key), p, n, _rc(replicate))

    def upsert(self, key: str, value, replicate: Optional[Replicate] = None) -> None:
        """Stores value under key, replacing an existing value."""
        p, n = to_bytes_pointer(value)
        _lib.call(lib.mc_store_upsert, self.handle, _lib.cstr(key), p, n, _rc(replicate))

    def put_from(self, key: str, buf: Buffer, length: Optional[int] = None,
                 replicate: Optional[Replicate] = None) -> None:
        """Stores ``length`` bytes of a registered buffer (zero-copy),
        write-once as put."""
        addr, n = address(buf, length)
        _lib.call(lib.mc_store_put_from, self.handle, _lib.cstr(key), addr, n, _rc(replicate))

    def upsert_from(self, key: str, buf: Buffer, length: Optional[int] = None,
                    replicate: Optional[Replicate] = None) -> None:
        """Stores ``length`` bytes of buf under key, replacing an existing
        value. Unlike put_from, buf may be any memory: registered memory is
        read directly, other memory through the staging buffer."""
        addr, n = address(buf, length)
        _lib.call(lib.mc_store_upsert, self.handle, _lib.cstr(key), addr, n, _rc(replicate))

    def get(self, key: str) -> bytes:
        """The value of key (raises ObjectNotFound when absent).

        The bytes returned are read into directly (one copy, from the
        staging buffer), in one call when the value is no larger than the
        last one this store's get read: a KV cache's values share a size.
        A larger value costs a second call (the first reports its size); a
        smaller one a copy of its bytes."""
        k = _lib.cstr(key)
        n = c_uint64()
        e = _lib._err()
        size = self._get_hint
        while True:
            buf, addr = _new_bytes(size)
            rc = lib.mc_store_get(self.handle, k, addr, size, byref(n), e)
            if rc == 0:
                got = n.value
                self._get_hint = max(got, _GET_HINT_MIN)
                if got == size and isinstance(buf, bytes):
                    return buf
                return ctypes.string_at(addr, got)
            if rc != errors.BUFFER_TOO_SMALL:
                raise _lib.error_from(e)
            size = n.value  # reported by this call; retried if the value grows meanwhile

    def get_into(self, key: str, buf: Buffer, length: Optional[int] = None) -> int:
        """Reads the value of key into buf; returns its length."""
        addr, n = address(buf, length, writable=True)
        out = c_uint64()
        _lib.call(lib.mc_store_get_into, self.handle, _lib.cstr(key), addr, n, byref(out))
        return out.value

    def get_size(self, key: str) -> int:
        out = c_uint64()
        _lib.call(lib.mc_store_get_size, self.handle, _lib.cstr(key), byref(out))
        return out.value

    def exists(self, key: str) -> bool:
        out = c_int32()
        _lib.call(lib.mc_store_exist, self.handle, _lib.cstr(key), byref(out))
        return out.value == 1

    def remove(self, key: str, force: bool = False) -> None:
        """Deletes key (a leased object only with force)."""
        _lib.call(lib.mc_store_remove, self.handle, _lib.cstr(key), int(force))

    def remove_all(self, force: bool = False) -> int:
        """Removes every object; returns how many."""
        out = c_uint64()
        _lib.call(lib.mc_store_remove_all, self.handle, int(force), byref(out))
        return out.value

    def remove_by_regex(self, regex: str, force: bool = False) -> int:
        """Removes the readable objects whose key the RE2 pattern matches
        anywhere in it ("^prefix" for a prefix); returns how many. Leased
        objects go only with force; an empty or invalid pattern raises
        InvalidParams."""
        out = c_uint64()
        _lib.call(lib.mc_store_remove_by_regex, self.handle, _lib.cstr(regex), int(force), byref(out))
        return out.value

    # -- batches ---------------------------------------------------------
    # The _*_codes helpers return the library's status codes, one per key;
    # the public batch methods turn them into results.

    def _put_codes(self, fn, keys: Sequence[str], addrs, lengths, replicate) -> List[int]:
        n = len(keys)
        if len(addrs) != n or len(lengths) != n:
            raise ValueError("keys, buffers and sizes differ in number")
        if n == 0:
            return []
        codes = (c_int32 * n)()
        ptrs = (c_void_p * n)(*addrs)
        lens = (c_uint64 * n)(*lengths)
        rc = fn(self.handle, _keys(keys), ptrs, lens, n, _rc(replicate), codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(codes)

    def _put_values_codes(self, fn, keys: Sequence[str], values: Sequence, replicate) -> List[int]:
        """_put_codes of values in any memory (batch put and upsert)."""
        held = [to_bytes_pointer(v) for v in values]  # keeps converted values alive over the call
        return self._put_codes(fn, keys, [_addr_of(p) for p, _ in held], [n for _, n in held], replicate)

    def _get_into_codes(self, keys: Sequence[str], addrs, lengths) -> Tuple[List[int], List[int]]:
        n = len(keys)
        if len(addrs) != n or len(lengths) != n:
            raise ValueError("keys, buffers and sizes differ in number")
        if n == 0:
            return [], []
        codes = (c_int32 * n)()
        outs = (c_uint64 * n)()
        ptrs = (c_void_p * n)(*addrs)
        lens = (c_uint64 * n)(*lengths)
        rc = lib.mc_store_batch_get_into(self.handle, _keys(keys), ptrs, lens, n, outs, codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(codes), list(outs)

    def _exist_codes(self, keys: Sequence[str]) -> Tuple[List[int], List[int]]:
        n = len(keys)
        if n == 0:
            return [], []
        ex = (c_int32 * n)()
        codes = (c_int32 * n)()
        rc = lib.mc_store_batch_exist(self.handle, _keys(keys), n, ex, codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(ex), list(codes)

    def batch_put(self, keys: Sequence[str], values: Sequence, replicate: Optional[Replicate] = None) -> List[Result]:
        """Puts values (any memory) under keys; None or the error per key
        (ObjectAlreadyExists for a key that exists, as put)."""
        return _results(self._put_values_codes(lib.mc_store_batch_put, keys, values, replicate))

    def batch_upsert(self, keys: Sequence[str], values: Sequence,
                     replicate: Optional[Replicate] = None) -> List[Result]:
        """Upserts values (any memory) under keys; None or the error per key."""
        return _results(self._put_values_codes(lib.mc_store_batch_upsert, keys, values, replicate))

    def batch_put_from(self, keys: Sequence[str], bufs: Sequence[Buffer], lengths: Optional[Sequence[int]] = None,
                       replicate: Optional[Replicate] = None) -> List[Result]:
        """put_from of registered buffers (``lengths[i]`` bytes of
        ``bufs[i]``, or all of it); None or the error per key. Keys,
        buffers and lengths that differ in number raise ValueError."""
        addrs, lens = _resolve_many(bufs, lengths, writable=False)
        return _results(self._put_codes(lib.mc_store_batch_put_from, keys, addrs, lens, replicate))

    def batch_upsert_from(self, keys: Sequence[str], bufs: Sequence[Buffer], lengths: Optional[Sequence[int]] = None,
                          replicate: Optional[Replicate] = None) -> List[Result]:
        """upsert_from of many buffers (any memory, as upsert_from); None
        or the error per key."""
        addrs, lens = _resolve_many(bufs, lengths, writable=False)
        return _results(self._put_codes(lib.mc_store_batch_upsert, keys, addrs, lens, replicate))

    def batch_get_into(self, keys: Sequence[str], bufs: Sequence[Buffer],
                       lengths: Optional[Sequence[int]] = None) -> List[Result]:
        """get_into per key; the value's length or the error per key."""
        addrs, lens = _resolve_many(bufs, lengths, writable=True)
        codes, outs = self._get_into_codes(keys, addrs, lens)
        return [o if c == 0 else _code_error(c) for c, o in zip(codes, outs)]

    def _parts_codes(self, get: bool, keys: Sequence[str], addr_lists, size_lists, replicate=None,
                     offset_lists=None) -> Tuple[List[int], List[int]]:
        """(codes, lengths) of a put/get of values made of parts, given as
        one list of addresses and one of sizes per key. With offset_lists
        (one list of offsets per key), ranges instead: a ranged get reads
        size_lists[i][j] bytes from offset offset_lists[i][j] of keys[i]'s
        value into addr_lists[i][j], a ranged put (a put session's write)
        writes them from there to that offset; lengths are then the bytes
        moved. A key whose lists differ in length gets INVALID_PARAMS
        without being sent."""
        n = len(keys)
        lists = [addr_lists, size_lists] + ([] if offset_lists is None else [offset_lists])
        if any(len(x) != n for x in lists):
            raise ValueError("keys, buffer lists, size lists and offset lists differ in number")
        codes, outs = [0] * n, [0] * n
        send = []
        for i in range(n):
            if any(len(x[i]) != len(size_lists[i]) for x in lists):
                codes[i] = _INVALID_PARAMS
            else:
                send.append(i)
        if not send:
            return codes, outs
        flat = [[int(v) for i in send for v in x[i]] for x in lists]
        if any(v < 0 for x in flat[1:] for v in x):
            raise ValueError("negative size or offset")
        m, total = len(send), len(flat[0])
        ptrs = (c_void_p * max(total, 1))(*flat[0])
        lens = (c_uint64 * max(total, 1))(*flat[1])
        counts = (c_size_t * m)(*[len(addr_lists[i]) for i in send])
        cs, got = (c_int32 * m)(), (c_uint64 * m)()
        ks = _keys([keys[i] for i in send])
        if offset_lists is not None:
            offs = (c_uint64 * max(total, 1))(*flat[2])
            fn = lib.mc_store_batch_get_ranges if get else lib.mc_store_batch_put_ranges
            rc = fn(self.handle, ks, ptrs, lens, offs, counts, m, got, cs, _lib._err())
        elif get:
            rc = lib.mc_store_batch_get_into_parts(self.handle, ks, ptrs, lens, counts, m, got, cs, _lib._err())
        else:
            rc = lib.mc_store_batch_put_from_parts(self.handle, ks, ptrs, lens, counts, m, _rc(replicate), cs,
                                                   _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        for j, i in enumerate(send):
            codes[i], outs[i] = cs[j], got[j]
        return codes, outs

    def _parts_flat_codes(self, get: bool, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int],
                          counts: Union[int, Sequence[int]], replicate=None) -> Tuple[List[int], List[int]]:
        """_parts_codes for callers whose pieces come as flat lists already
        (a KV pool's zero-copy metadata): ptrs and sizes hold every key's
        pieces in order, counts[i] of them for keys[i] (an int: that many
        for each key). The arrays are built in C (array.array), not element
        by element: for hundreds of pieces a batch, that is most of the
        Python time of the call. (codes, lengths) as _parts_codes; lists
        that do not add up, or a negative size, raise ValueError."""
        m = len(keys)
        per = [counts] * m if isinstance(counts, int) else list(counts)
        total = len(ptrs)
        if len(per) != m or len(sizes) != total or sum(per) != total or any(c < 0 for c in per):
            raise ValueError(f"{m} keys, {len(per)} piece counts adding up to {sum(per)}, {total} pieces and "
                             f"{len(sizes)} sizes")
        if m == 0:
            return [], []
        try:
            pa, la, ca = array.array("Q", ptrs), array.array("Q", sizes), array.array(_SIZE_T_CODE, per)
        except OverflowError as e:
            raise ValueError(f"negative or too large address or size: {e}") from None
        if total == 0:  # from_buffer needs memory: one unused element
            pa, la = array.array("Q", [0]), array.array("Q", [0])
        cs, got = (c_int32 * m)(), (c_uint64 * m)()
        ks = _keys(keys)
        pp = (c_void_p * len(pa)).from_buffer(pa)
        lp = (c_uint64 * len(la)).from_buffer(la)
        cp = (c_size_t * m).from_buffer(ca)
        if get:
            rc = lib.mc_store_batch_get_into_parts(self.handle, ks, pp, lp, cp, m, got, cs, _lib._err())
        else:
            rc = lib.mc_store_batch_put_from_parts(self.handle, ks, pp, lp, cp, m, _rc(replicate), cs, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(cs), list(got)

    def _parts_uniform_codes(self, get: bool, keys, ptrs, sizes, per: int, replicate=None):
        """_parts_flat_codes for a batch whose keys have per pieces each,
        their addresses and sizes given as C-contiguous buffers of 64-bit
        integers (numpy arrays, array.array) of len(keys) * per elements,
        which go to the library as they are: nothing is converted per piece
        or per key. keys: strings or a (c_char_p * n) array of the caller's.
        Returns the raw (c_int32) codes and (c_uint64) lengths, one per key.
        Buffers of another size raise ValueError."""
        m = len(keys)
        total = m * per
        views = [memoryview(b) for b in (ptrs, sizes)]
        if per < 0 or any(v.itemsize != 8 or v.nbytes != 8 * total or not v.c_contiguous for v in views):
            raise ValueError(f"{m} keys of {per} pieces: {[v.nbytes // max(v.itemsize, 1) for v in views]} addresses "
                             f"and sizes of 8-byte integers")
        cs, got = (c_int32 * m)(), (c_uint64 * m)()
        if m == 0:
            return cs, got
        if total == 0:  # from_buffer needs memory: one unused element
            ptrs = sizes = array.array("Q", [0])
            total = 1
        pp = (c_void_p * total).from_buffer(ptrs)
        lp = (c_uint64 * total).from_buffer(sizes)
        cp = (c_size_t * m).from_buffer(array.array(_SIZE_T_CODE, [per]) * m)
        ks = _keys(keys)
        if get:
            rc = lib.mc_store_batch_get_into_parts(self.handle, ks, pp, lp, cp, m, got, cs, _lib._err())
        else:
            rc = lib.mc_store_batch_put_from_parts(self.handle, ks, pp, lp, cp, m, _rc(replicate), cs, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return cs, got

    def batch_put_from_parts(self, keys: Sequence[str], parts: Sequence[Sequence[Buffer]],
                             sizes: Optional[Sequence[Sequence[int]]] = None,
                             replicate: Optional[Replicate] = None) -> List[Result]:
        """Puts values made of parts: the value of ``keys[i]`` is the
        concatenation of the buffers ``parts[i]`` (``sizes[i]`` bytes of
        each, or all of them), e.g. one per layer of a KV cache. Every part
        must lie in a registered buffer; the bytes go from the parts
        straight to the replicas, without a copy. None or the error per
        key: a key whose ``parts[i]`` and ``sizes[i]`` differ in length
        gets InvalidParams without being sent. Outer lists that differ in
        number, or a negative size, raise ValueError."""
        addrs, lens = _resolve_parts(parts, sizes, writable=False)
        return _results(self._parts_codes(False, keys, addrs, lens, replicate)[0])

    def batch_get_into_parts(self, keys: Sequence[str], parts: Sequence[Sequence[Buffer]],
                             sizes: Optional[Sequence[Sequence[int]]] = None) -> List[Result]:
        """Reads each value across its parts in order, straight into them
        (registered buffers only). A value longer than its parts together
        fails (nothing read); a shorter one fills a prefix. The value's
        length or the error per key (lists as batch_put_from_parts)."""
        addrs, lens = _resolve_parts(parts, sizes, writable=True)
        codes, outs = self._parts_codes(True, keys, addrs, lens)
        return [o if c == 0 else _code_error(c) for c, o in zip(codes, outs)]

    # -- ranged reads, get sessions, replicas (ABI 1.3) ------------------

    def batch_get_ranges(self, keys: Sequence[str], ranges: Sequence[Sequence[Range]]) -> List[Result]:
        """Reads pieces of values: ``ranges[i]`` is a list of
        ``(offset in the value, buffer)`` or ``(offset, buffer, length)``
        for ``keys[i]``; each buffer (its first ``length`` bytes) is filled
        with the value's bytes from that offset. Bytes read or the error
        per key (a range past the value's end: InvalidParams). Keys and
        range lists that differ in number, or a negative offset or
        length, raise ValueError."""
        addrs, lens, srcs = _resolve_ranges(ranges, writable=True)
        codes, outs = self._parts_codes(True, keys, addrs, lens, offset_lists=srcs)
        return [o if c == 0 else _code_error(c) for c, o in zip(codes, outs)]

    def _session_start_codes(self, keys: Sequence[str]) -> List[int]:
        n = len(keys)
        if n == 0:
            return []
        codes = (c_int32 * n)()
        rc = lib.mc_store_batch_get_session_start(self.handle, _keys(keys), n, codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(codes)

    def get_session_start(self, keys: Sequence[str]) -> List[Result]:
        """Looks the replicas of keys up once and keeps them for their
        lease, for the reads that follow; None or the error per key."""
        return _results(self._session_start_codes(keys))

    def get_session_end(self, keys: Sequence[str]) -> None:
        """Forgets what get_session_start kept for keys."""
        if keys:
            _lib.call(lib.mc_store_batch_get_session_end, self.handle, _keys(keys), len(keys))

    # -- put sessions (ABI 1.4) ------------------------------------------

    def _put_session_start_codes(self, keys: Sequence[str], sizes: Sequence[int],
                                 replicate: Optional[Replicate] = None) -> List[int]:
        n = len(keys)
        if len(sizes) != n:
            raise ValueError("keys and sizes differ in number")
        ns = [int(x) for x in sizes]
        if any(x < 0 for x in ns):
            raise ValueError("negative size")
        if n == 0:
            return []
        codes = (c_int32 * n)()
        rc = lib.mc_store_batch_put_session_start(self.handle, _keys(keys), (c_uint64 * n)(*ns), n, _rc(replicate),
                                                  codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(codes)

    def put_session_start(self, keys: Sequence[str], sizes: Sequence[int],
                          replicate: Optional[Replicate] = None) -> List[Result]:
        """Reserves room for values of the given sizes under keys (one
        master round trip), to be written piece by piece with
        batch_put_ranges and made readable by put_session_end; None or the
        error per key (a key that exists: ObjectAlreadyExists)."""
        return _results(self._put_session_start_codes(keys, sizes, replicate))

    def batch_put_ranges(self, keys: Sequence[str], ranges: Sequence[Sequence[Range]]) -> List[Result]:
        """Writes pieces of the values of open put sessions: ``ranges[i]``
        is a list of ``(offset in the value, buffer)`` or ``(offset,
        buffer, length)`` for ``keys[i]``; each buffer's bytes land at that
        offset, in any order. Bytes written or the error per key (no
        session, or a range past the size: InvalidParams); malformed lists
        raise ValueError, as for batch_get_ranges."""
        addrs, lens, dsts = _resolve_ranges(ranges, writable=False)
        codes, outs = self._parts_codes(False, keys, addrs, lens, offset_lists=dsts)
        return [o if c == 0 else _code_error(c) for c, o in zip(codes, outs)]

    def _put_session_codes(self, end: bool, keys: Sequence[str]) -> List[int]:
        n = len(keys)
        if n == 0:
            return []
        codes = (c_int32 * n)()
        fn = lib.mc_store_batch_put_session_end if end else lib.mc_store_batch_put_session_revoke
        rc = fn(self.handle, _keys(keys), n, codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(codes)

    def put_session_end(self, keys: Sequence[str]) -> List[Result]:
        """Makes the values of keys readable once the writes in progress
        on them are done, and closes their sessions; None or the error per
        key (no session: InvalidParams; a refused end keeps its session)."""
        return _results(self._put_session_codes(True, keys))

    def put_session_revoke(self, keys: Sequence[str]) -> List[Result]:
        """Gives back the room reserved for keys and closes their sessions:
        the values never become readable. None or the error per key."""
        return _results(self._put_session_codes(False, keys))

    def replicas(self, key: str) -> List[dict]:
        """Every replica of key the master lists: dicts with kind
        ("memory", "disk" or "local_disk"), status (Mooncake's
        ReplicaStatus number), buffer_address, size, segment_name,
        transport_endpoint and file_path."""
        k = _lib.cstr(key)
        cap = 4
        while True:
            out = (_lib.ReplicaDesc * cap)()
            n = c_size_t()
            e = _lib._err()
            rc = lib.mc_store_get_replicas(self.handle, k, out, cap, byref(n), e)
            if rc == errors.BUFFER_TOO_SMALL:
                cap = n.value
                continue
            if rc != 0:
                raise _lib.error_from(e)
            kinds = {_lib.REPLICA_MEMORY: "memory", _lib.REPLICA_DISK: "disk", _lib.REPLICA_LOCAL_DISK: "local_disk"}
            return [dict(kind=kinds.get(d.kind, "memory"), status=d.status, buffer_address=d.buffer_address,
                         size=d.size, segment_name=d.segment_name.decode(errors="replace"),
                         transport_endpoint=d.transport_endpoint.decode(errors="replace"),
                         file_path=d.file_path.decode(errors="replace")) for d in out[:n.value]]

    def _remove_codes(self, keys: Sequence[str], force: bool) -> List[int]:
        n = len(keys)
        if n == 0:
            return []
        codes = (c_int32 * n)()
        rc = lib.mc_store_batch_remove(self.handle, _keys(keys), n, int(force), codes, _lib._err())
        if rc in _WHOLE_CALL_FAILURES:
            raise _lib.last_error()
        return list(codes)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> List[Result]:
        """remove of many keys in one master round trip; None or the error
        per key."""
        return _results(self._remove_codes(keys, force))

    def batch_exists(self, keys: Sequence[str], *, raise_on_error: bool = True
                     ) -> List[Union[bool, errors.MooncakeError]]:
        """Whether each key is readable. A key the master refuses raises
        its error, or with ``raise_on_error=False`` has it in its place."""
        ex, codes = self._exist_codes(keys)
        if raise_on_error:
            for c in codes:
                if c != 0:
                    raise _code_error(c)
        return [x == 1 if c == 0 else _code_error(c) for x, c in zip(ex, codes)]

    # -- lifecycle -------------------------------------------------------

    @staticmethod
    def supports(feature: str) -> bool:
        """Whether the loaded library has feature (its ABI minor is recent
        enough): "ranges" (batch_get_ranges), "get_sessions", "replicas"
        (ABI 1.3), "put_sessions" (put_session_*, batch_put_ranges; ABI
        1.4). Without it the feature's methods raise InvalidParams saying
        which version they need. Loads the library."""
        if feature not in _FEATURES:
            raise ValueError(f"unknown feature {feature!r} (want one of {', '.join(sorted(_FEATURES))})")
        return _lib.available(_FEATURES[feature])

    def close(self) -> None:
        """Leaves the pool (this client's replicas go with it). Idempotent."""
        super().close()

    def __repr__(self) -> str:
        return "<Store closed>" if self.closed else f"<Store {self.name}>"


_INVALID_PARAMS = -600  # MC_STORE_ERR_INVALID_PARAMS

# Store.supports's features, each named by a function that has it.
_FEATURES = {
    "ranges": "mc_store_batch_get_ranges",
    "get_sessions": "mc_store_batch_get_session_start",
    "replicas": "mc_store_get_replicas",
    "put_sessions": "mc_store_batch_put_session_start",
}

# The array.array type code of size_t (piece counts), "Q" on 64-bit hosts.
_SIZE_T_CODE = next(c for c in "QLI" if array.array(c).itemsize == ctypes.sizeof(c_size_t))

# Codes for which a batch call did not run at all (no per-key codes).
_WHOLE_CALL_FAILURES = frozenset({errors.INVALID_HANDLE, errors.NULL_ARGUMENT, errors.PANIC, errors.STRUCT_SIZE})

# get reads into a buffer of at least this many bytes.
_GET_HINT_MIN = 4096
# The ABI minor of mc_store_config_t.report_existing.
_REPORT_EXISTING_MINOR = 7
# The ABI minor of mc_store_config_t's credentials (auth_token, tls_*).
_CREDENTIALS_MINOR = 8
# The ABI minor of mc_store_config_t.tenant_id.
_TENANT_MINOR = 10
# The ABI minor of mc_store_config_t.tls_server_name.
_SERVER_NAME_MINOR = 12


def _new_bytes(size: int):
    """(a buffer of size bytes for the library to fill, its address). On
    CPython the buffer is a new bytes object, uninitialised: nothing else
    holds it until get returns it, so filling it in place is safe, and it
    saves both the zeroing of a ctypes buffer and the copy out of it.
    Sizes below 2 never come here (CPython shares those bytes objects)."""
    if _PyBytes_FromStringAndSize is not None:
        b = _PyBytes_FromStringAndSize(None, size)
        return b, ctypes.cast(c_char_p(b), c_void_p).value or 0
    buf = ctypes.create_string_buffer(size)
    return buf, ctypes.addressof(buf)


def _bytes_constructor():
    try:
        fn = ctypes.pythonapi.PyBytes_FromStringAndSize
    except (AttributeError, ValueError):  # not CPython
        return None
    fn.restype = ctypes.py_object
    fn.argtypes = [c_char_p, ctypes.c_ssize_t]
    return fn


_PyBytes_FromStringAndSize = _bytes_constructor()


def _rc(r: Optional[Replicate]):
    return None if r is None else r._c()


def _addr_of(p) -> int:
    if isinstance(p, bytes):
        return ctypes.cast(c_char_p(p), c_void_p).value or 0
    return p


def _resolve_many(bufs, lengths, writable: bool):
    if lengths is None:
        pairs = [address(b, None, writable=writable) for b in bufs]
    else:
        if len(lengths) != len(bufs):
            raise ValueError("buffers and sizes differ in number")
        pairs = [address(b, n, writable=writable) for b, n in zip(bufs, lengths)]
    return [a for a, _ in pairs], [n for _, n in pairs]


def _resolve_parts(parts, sizes, writable: bool):
    if sizes is None:
        sizes = [None] * len(parts)
    elif len(sizes) != len(parts):
        raise ValueError("part lists and size lists differ in number")
    addrs, lens = [], []
    for ps, ns in zip(parts, sizes):
        if ns is not None and len(ns) != len(ps):
            # Lists that differ stay different: _parts_codes refuses the key.
            a, n = [0] * len(ps), [0] * len(ns)
        else:
            a, n = _resolve_many(ps, ns, writable=writable)
        addrs.append(a)
        lens.append(n)
    return addrs, lens


def _resolve_ranges(ranges, writable: bool):
    """(addresses, lengths, offsets), one list of each per key, of ranges
    given as (offset, buffer) or (offset, buffer, length)."""
    addrs, lens, offs = [], [], []
    for rs in ranges:
        a, n, o = [], [], []
        for r in rs:
            if len(r) not in (2, 3):
                raise ValueError(f"range {r!r}: want (offset, buffer) or (offset, buffer, length)")
            p, m = address(r[1], r[2] if len(r) == 3 else None, writable=writable)
            a.append(p)
            n.append(m)
            o.append(int(r[0]))
        addrs.append(a)
        lens.append(n)
        offs.append(o)
    return addrs, lens, offs


def _code_error(code: int) -> errors.MooncakeError:
    domain = errors.DOMAIN_ABI if code <= -9000 else errors.DOMAIN_STORE
    return errors.from_status(code, domain, _lib.status_name(domain, code))


def _results(codes: List[int]) -> List[Result]:
    return [None if c == 0 else _code_error(c) for c in codes]


__all__ = ["Store", "Replicate"]
