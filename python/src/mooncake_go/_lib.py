"""ctypes declarations of include/mooncake.h and the one loaded library.

Everything that knows the C layout lives here; the rest of the package
calls ``call(fn, *args)``, which appends the per-thread error struct and
turns a non-zero status into an exception.

The library is loaded with ctypes.CDLL, so every foreign call releases the
GIL for its whole duration (ctypes drops it around the call and takes it
back afterwards): a thread blocked in a transfer or a store call never
stops the other Python threads. The library must be loaded once per
process and never unloaded (a Go runtime cannot be); this module is that
one load, done at the first call (not at import: see _Library).

libmooncake.so is two files: the public library, a small C library that
starts nothing when loaded, and the Go library beside it
(libmooncake_go.so), which the public one loads at its first call that
needs Go. A process may therefore load the package, even call it, and fork
workers that use it, as long as nothing that needs Go ran before the fork
(vLLM's default start method on CPU is fork). After a fork that follows
such a call, every call in the child raises an error that says so (a Go
runtime does not survive fork()); it does not hang.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import TypeVar

from . import errors

ABI_VERSION_MAJOR = 1
# The oldest minor this package loads (1.1: values made of parts; 1.2:
# remove by regex, batch remove). Functions of later minors (1.3: ranged
# reads, get sessions, replica descriptors; 1.4: put sessions) are bound
# when the library has them and refused, saying why, when it does not.
ABI_VERSION_MINOR = 2
LIBRARY_NAME = "libmooncake.so"
GO_LIBRARY_NAME = "libmooncake_go.so"  # loaded by libmooncake.so, from beside it

# Transfer states (MC_TRANSFER_*), numbered as Mooncake's STATUS_*.
WAITING, PENDING, INVALID, CANCELED, COMPLETED, TIMEOUT, FAILED = range(7)
OP_READ, OP_WRITE = 0, 1
LOCAL_SEGMENT = 0
ERROR_MESSAGE_SIZE = 512


class Error(Structure):
    _fields_ = [("code", c_int32), ("domain", c_int32), ("message", c_char * ERROR_MESSAGE_SIZE)]


class EngineConfig(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("lanes", c_uint32),
        ("metadata", c_char_p),
        ("local_server_name", c_char_p),
        ("host", c_char_p),
        ("transport", c_char_p),
        ("secret", c_char_p),
        ("rpc_port", c_uint32),
        ("data_port", c_uint32),
        ("slice_size", c_uint64),
        ("timeout_ms", c_uint64),
        ("max_retries", c_uint32),
        ("reserved", c_uint32),
    ]


class Request(Structure):
    _fields_ = [
        ("opcode", c_int32),
        ("reserved", c_uint32),
        ("local", c_void_p),
        ("segment", c_uint64),
        ("remote_addr", c_uint64),
        ("length", c_uint64),
    ]


class TransferStatus(Structure):
    _fields_ = [("state", c_int32), ("error_code", c_int32), ("transferred", c_uint64)]


class BufferDesc(Structure):
    _fields_ = [("addr", c_uint64), ("length", c_uint64)]


class Notify(Structure):
    _fields_ = [("name", c_void_p), ("msg", c_void_p), ("name_len", c_size_t), ("msg_len", c_size_t)]


class StoreConfig(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("replicas", c_uint32),
        ("master", c_char_p),
        ("local_hostname", c_char_p),
        ("metadata", c_char_p),
        ("protocol", c_char_p),
        ("cluster_id", c_char_p),
        ("segment_size", c_int64),
        ("local_buffer_size", c_int64),
        ("rpc_timeout_ms", c_uint64),
        ("engine", c_uint64),
        ("no_checksum", c_uint32),
        ("reserved", c_uint32),
        ("op_timeout_ms", c_uint64),  # ABI 1.5
        ("report_existing", c_uint32),  # ABI 1.7
        ("auth_token", c_char_p),  # ABI 1.8
        ("tls_ca_file", c_char_p),
        ("tls_cert_file", c_char_p),
        ("tls_key_file", c_char_p),
        ("te_secret", c_char_p),
        ("tenant_id", c_char_p),  # ABI 1.10
        ("tls_server_name", c_char_p),  # ABI 1.12
    ]


class ReplicateConfig(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("replicas", c_uint32),
        ("soft_pin", c_uint32),
        ("hard_pin", c_uint32),
        ("soft_pin_ttl_ms", c_uint64),
        ("prefer_local", c_uint32),
        ("n_preferred", c_uint32),
        ("preferred_segments", POINTER(c_char_p)),
        ("stripe_count", c_uint32),  # ABI 1.11
    ]


REPLICA_NAME_SIZE = 256
REPLICA_MEMORY, REPLICA_DISK, REPLICA_LOCAL_DISK = 0, 1, 2


class ReplicaDesc(Structure):
    _fields_ = [
        ("kind", c_int32),
        ("status", c_int32),
        ("buffer_address", c_uint64),
        ("size", c_uint64),
        ("segment_name", c_char * REPLICA_NAME_SIZE),
        ("transport_endpoint", c_char * REPLICA_NAME_SIZE),
        ("file_path", c_char * REPLICA_NAME_SIZE),
    ]


_ERR = POINTER(Error)
_U64P = POINTER(c_uint64)
_I32P = POINTER(c_int32)
_VPP = POINTER(c_void_p)
_CPP = POINTER(c_char_p)
_SZP = POINTER(c_size_t)

# name: (restype, argtypes without the trailing mc_error_t*)
_SIGNATURES = {
    "mc_engine_create": (c_int32, [POINTER(EngineConfig), _U64P]),
    "mc_engine_destroy": (c_int32, [c_uint64]),
    "mc_engine_name": (c_int32, [c_uint64, c_char_p, c_size_t, POINTER(c_size_t)]),
    "mc_engine_ports": (c_int32, [c_uint64, POINTER(c_uint32), POINTER(c_uint32)]),
    "mc_engine_register_memory": (c_int32, [c_uint64, c_void_p, c_uint64, c_char_p, c_int]),
    "mc_copy": (c_int32, [c_void_p, c_void_p, c_uint64]),
    "mc_engine_unregister_memory": (c_int32, [c_uint64, c_void_p]),
    "mc_engine_allocate_buffer": (c_int32, [c_uint64, c_uint64, c_char_p, _VPP]),
    "mc_engine_free_buffer": (c_int32, [c_uint64, c_void_p]),
    "mc_engine_open_segment": (c_int32, [c_uint64, c_char_p, _U64P]),
    "mc_engine_close_segment": (c_int32, [c_uint64, c_uint64]),
    "mc_engine_segment_buffers": (c_int32, [c_uint64, c_uint64, POINTER(BufferDesc), c_size_t, POINTER(c_size_t)]),
    "mc_engine_allocate_batch": (c_int32, [c_uint64, c_uint32, _U64P]),
    "mc_engine_free_batch": (c_int32, [c_uint64, c_uint64]),
    "mc_engine_submit": (c_int32, [c_uint64, c_uint64, c_void_p, c_size_t]),
    "mc_engine_submit_with_notify": (c_int32, [c_uint64, c_uint64, c_void_p, c_size_t, c_char_p, c_char_p]),
    "mc_engine_task_status": (c_int32, [c_uint64, c_uint64, c_uint64, POINTER(TransferStatus)]),
    "mc_engine_batch_status": (c_int32, [c_uint64, c_uint64, POINTER(TransferStatus)]),
    "mc_engine_wait": (c_int32, [c_uint64, c_uint64, c_int64, POINTER(TransferStatus)]),
    "mc_engine_send_notify": (c_int32, [c_uint64, c_uint64, c_char_p, c_char_p]),
    "mc_engine_get_notifies": (c_int32, [c_uint64, POINTER(POINTER(Notify)), POINTER(c_size_t)]),
    "mc_store_create": (c_int32, [POINTER(StoreConfig), _U64P]),
    "mc_store_close": (c_int32, [c_uint64]),
    "mc_store_name": (c_int32, [c_uint64, c_char_p, c_size_t, POINTER(c_size_t)]),
    "mc_store_register_buffer": (c_int32, [c_uint64, c_void_p, c_uint64]),
    "mc_store_unregister_buffer": (c_int32, [c_uint64, c_void_p]),
    "mc_store_put": (c_int32, [c_uint64, c_char_p, c_void_p, c_uint64, POINTER(ReplicateConfig)]),
    "mc_store_put_from": (c_int32, [c_uint64, c_char_p, c_void_p, c_uint64, POINTER(ReplicateConfig)]),
    "mc_store_upsert": (c_int32, [c_uint64, c_char_p, c_void_p, c_uint64, POINTER(ReplicateConfig)]),
    "mc_store_get": (c_int32, [c_uint64, c_char_p, c_void_p, c_uint64, _U64P]),
    "mc_store_get_into": (c_int32, [c_uint64, c_char_p, c_void_p, c_uint64, _U64P]),
    "mc_store_get_size": (c_int32, [c_uint64, c_char_p, _U64P]),
    "mc_store_batch_put": (c_int32, [c_uint64, _CPP, _VPP, _U64P, c_size_t, POINTER(ReplicateConfig), _I32P]),
    "mc_store_batch_put_from": (c_int32, [c_uint64, _CPP, _VPP, _U64P, c_size_t, POINTER(ReplicateConfig), _I32P]),
    "mc_store_batch_upsert": (c_int32, [c_uint64, _CPP, _VPP, _U64P, c_size_t, POINTER(ReplicateConfig), _I32P]),
    "mc_store_batch_get_into": (c_int32, [c_uint64, _CPP, _VPP, _U64P, c_size_t, _U64P, _I32P]),
    "mc_store_batch_put_from_parts": (
        c_int32, [c_uint64, _CPP, _VPP, _U64P, _SZP, c_size_t, POINTER(ReplicateConfig), _I32P]),
    "mc_store_batch_get_into_parts": (c_int32, [c_uint64, _CPP, _VPP, _U64P, _SZP, c_size_t, _U64P, _I32P]),
    "mc_store_exist": (c_int32, [c_uint64, c_char_p, _I32P]),
    "mc_store_batch_exist": (c_int32, [c_uint64, _CPP, c_size_t, _I32P, _I32P]),
    "mc_store_batch_remove": (c_int32, [c_uint64, _CPP, c_size_t, c_int, _I32P]),
    "mc_store_remove": (c_int32, [c_uint64, c_char_p, c_int]),
    "mc_store_remove_all": (c_int32, [c_uint64, c_int, _U64P]),
    "mc_store_remove_by_regex": (c_int32, [c_uint64, c_char_p, c_int, _U64P]),
    "mc_debug_panic": (c_int32, []),
    "mc_debug_live_handles": (c_int32, [_U64P, _U64P]),
    # ABI 1.3
    "mc_store_batch_get_ranges": (c_int32, [c_uint64, _CPP, _VPP, _U64P, _U64P, _SZP, c_size_t, _U64P, _I32P]),
    "mc_store_batch_get_session_start": (c_int32, [c_uint64, _CPP, c_size_t, _I32P]),
    "mc_store_batch_get_session_end": (c_int32, [c_uint64, _CPP, c_size_t]),
    "mc_store_get_replicas": (c_int32, [c_uint64, c_char_p, POINTER(ReplicaDesc), c_size_t, _SZP]),
    # ABI 1.4
    "mc_store_batch_put_session_start": (
        c_int32, [c_uint64, _CPP, _U64P, c_size_t, POINTER(ReplicateConfig), _I32P]),
    "mc_store_batch_put_ranges": (c_int32, [c_uint64, _CPP, _VPP, _U64P, _U64P, _SZP, c_size_t, _U64P, _I32P]),
    "mc_store_batch_put_session_end": (c_int32, [c_uint64, _CPP, c_size_t, _I32P]),
    "mc_store_batch_put_session_revoke": (c_int32, [c_uint64, _CPP, c_size_t, _I32P]),
    # ABI 1.9: dummy clients
    "mc_dummy_create": (c_int32, [c_char_p, c_uint64, c_uint64, _U64P]),
    "mc_dummy_close": (c_int32, [c_uint64]),
    "mc_dummy_alloc": (c_int32, [c_uint64, c_uint64, _VPP]),
    "mc_dummy_free": (c_int32, [c_uint64, c_void_p]),
    "mc_dummy_register_shared": (c_int32, [c_uint64, c_int, c_uint64, c_void_p, c_uint64]),
    "mc_dummy_unregister_shared": (c_int32, [c_uint64, c_void_p]),
    "mc_dummy_batch_put": (c_int32, [c_uint64, _CPP, _VPP, _U64P, c_size_t, c_int, POINTER(ReplicateConfig), _I32P]),
    "mc_dummy_batch_get_into": (c_int32, [c_uint64, _CPP, _VPP, _U64P, c_size_t, _U64P, _I32P]),
    "mc_dummy_batch_exist": (c_int32, [c_uint64, _CPP, c_size_t, _I32P, _I32P]),
    "mc_dummy_get_size": (c_int32, [c_uint64, c_char_p, _U64P]),
    "mc_dummy_batch_remove": (c_int32, [c_uint64, _CPP, c_size_t, c_int, _I32P]),
    "mc_dummy_remove_all": (c_int32, [c_uint64, c_int, _U64P]),
}

# The minor version each function needs, where it is above ABI_VERSION_MINOR.
_MINOR = {
    "mc_store_batch_get_ranges": 3,
    "mc_store_batch_get_session_start": 3,
    "mc_store_batch_get_session_end": 3,
    "mc_store_get_replicas": 3,
    "mc_store_batch_put_session_start": 4,
    "mc_store_batch_put_ranges": 4,
    "mc_store_batch_put_session_end": 4,
    "mc_store_batch_put_session_revoke": 4,
    "mc_copy": 6,
    **{n: 9 for n in ("mc_dummy_create", "mc_dummy_close", "mc_dummy_alloc", "mc_dummy_free",
                      "mc_dummy_register_shared", "mc_dummy_unregister_shared", "mc_dummy_batch_put",
                      "mc_dummy_batch_get_into", "mc_dummy_batch_exist", "mc_dummy_get_size",
                      "mc_dummy_batch_remove", "mc_dummy_remove_all")},
}


def _find_library() -> str:
    """MOONCAKE_GO_LIBRARY if set, else the copy bundled in this package."""
    env = os.environ.get("MOONCAKE_GO_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    if os.path.exists(here):
        return here
    raise ImportError(
        f"mooncake_go: {LIBRARY_NAME} is not bundled with this installation; "
        "reinstall the package (pip install builds it with Go) or set MOONCAKE_GO_LIBRARY"
    )


def _check_go_library(path: str) -> None:
    """Raises ImportError unless the Go library lies beside path (or beside
    the file path links to), where libmooncake.so looks for it."""
    for d in (os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.realpath(path))):
        if os.path.exists(os.path.join(d, GO_LIBRARY_NAME)):
            return
    raise ImportError(
        f"mooncake_go: {GO_LIBRARY_NAME} is not beside {path}: the two files are one library "
        "(scripts/build-capi.sh builds both); reinstall the package or point MOONCAKE_GO_LIBRARY "
        "at a libmooncake.so that has it"
    )


def _load() -> ctypes.CDLL:
    path = _find_library()
    _check_go_library(path)
    # RTLD_GLOBAL: a C extension or plugin loaded later in this process
    # (a NIXL plugin, a connector) binds to this same copy, so the process
    # keeps one Go runtime.
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    lib.mc_abi_version.restype = c_uint32
    lib.mc_abi_version.argtypes = []
    v = lib.mc_abi_version()
    if v >> 16 != ABI_VERSION_MAJOR or v & 0xFFFF < ABI_VERSION_MINOR:
        raise ImportError(
            f"mooncake_go: {path} has ABI {v >> 16}.{v & 0xFFFF}, "
            f"this package needs {ABI_VERSION_MAJOR}.{ABI_VERSION_MINOR} or a later minor"
        )
    lib.mc_status_name.restype = c_char_p
    lib.mc_status_name.argtypes = [c_int32, c_int32]
    lib.mc_notifies_free.restype = None
    lib.mc_notifies_free.argtypes = [POINTER(Notify), c_size_t]
    return lib


def _bind(cdll: ctypes.CDLL, name: str):
    """The foreign function name with its prototype, or a _Refused when
    the loaded library's minor version predates it."""
    minor = cdll.mc_abi_version() & 0xFFFF
    need = _MINOR.get(name, ABI_VERSION_MINOR)
    if minor < need:
        return _Refused(name, need, cdll._name, minor)
    res, args = _SIGNATURES[name]
    fn = getattr(cdll, name)
    fn.restype = res
    fn.argtypes = args + [_ERR]
    return fn


class _Refused:
    """Stands for a function the loaded library is too old to have:
    calling it raises InvalidParams naming the function and both versions."""

    def __init__(self, name: str, need: int, path: str, minor: int):
        self._msg = f"{name} needs libmooncake ABI {ABI_VERSION_MAJOR}.{need}; {path} has {ABI_VERSION_MAJOR}.{minor}"

    def __call__(self, *args):
        raise errors.from_status(-600, errors.DOMAIN_STORE, "INVALID_PARAMS", self._msg)


class _Library:
    """The library, loaded on first use rather than at import.

    Loading libmooncake.so starts no runtime (its first call that needs Go
    does), so a fork after the load is safe; the load waits for first use
    all the same, so that importing the package costs nothing and cannot
    fail. After the load the foreign functions are plain attributes of this
    object (no per-call indirection)."""

    _lock = threading.Lock()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        with self._lock:
            if "_cdll" not in self.__dict__:
                cdll = _load()
                for n in ("mc_abi_version", "mc_status_name", "mc_notifies_free"):
                    self.__dict__[n] = getattr(cdll, n)
                for n in _SIGNATURES:
                    self.__dict__[n] = _bind(cdll, n)
                self.__dict__["_name"] = cdll._name
                self.__dict__["_cdll"] = cdll
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def loaded(self) -> bool:
        return "_cdll" in self.__dict__


lib = _Library()


def available(name: str) -> bool:
    """Whether the loaded library has the function name (its ABI minor
    is recent enough); loads the library."""
    return not isinstance(getattr(lib, name), _Refused)


def __getattr__(name):
    # path and abi_version load the library when first asked for.
    if name == "path":
        return lib._name
    if name == "abi_version":
        return lib.mc_abi_version()
    raise AttributeError(name)


_tls = threading.local()


def _err() -> Error:
    # One error struct per thread: the ABI writes it on every call, and
    # allocating it per call would cost more than many of the calls.
    e = getattr(_tls, "err", None)
    if e is None:
        e = _tls.err = Error()
    return e


def status_name(domain: int, code: int) -> str:
    return lib.mc_status_name(domain, code).decode()


def error_from(e: Error) -> errors.MooncakeError:
    return errors.from_status(e.code, e.domain, status_name(e.domain, e.code), e.message.decode("utf-8", "replace"))


def call(fn, *args) -> None:
    """Calls fn with args and this thread's error struct; raises on failure."""
    e = _err()
    if fn(*args, e) != 0:
        raise error_from(e)


_O = TypeVar("_O", bound="Owned")


class Owned:
    """An object that owns a library handle: close() releases it with the
    release function (mc_engine_destroy, mc_store_close), or the collector
    does if the object is dropped unclosed. A context manager."""

    def _own(self, handle: int, release) -> None:
        self.handle: int = handle
        self._release = release
        self._finalizer = weakref.finalize(self, release, handle, None)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Releases the handle. Idempotent."""
        if self._finalizer.alive:
            self._finalizer.detach()
            call(self._release, self.handle)

    def __enter__(self: _O) -> _O:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def last_error() -> errors.MooncakeError:
    """The error of this thread's last failed call (given _err())."""
    return error_from(_err())


def cstr(s) -> bytes | None:
    if s is None:
        return None
    if isinstance(s, bytes):
        return s
    return str(s).encode()


def read_string(fn, handle: int) -> str:
    """Reads a string through the len_out protocol."""
    buf = ctypes.create_string_buffer(256)
    n = c_size_t()
    e = _err()
    rc = fn(handle, buf, len(buf), ctypes.byref(n), e)
    if rc == errors.BUFFER_TOO_SMALL:
        buf = ctypes.create_string_buffer(n.value)
        rc = fn(handle, buf, len(buf), ctypes.byref(n), e)
    if rc != 0:
        raise error_from(e)
    return buf.value.decode()


def live_handles() -> tuple[int, int]:
    """(engines, stores) alive in this process: for leak checks."""
    a, b = c_uint64(), c_uint64()
    call(lib.mc_debug_live_handles, ctypes.byref(a), ctypes.byref(b))
    return a.value, b.value
