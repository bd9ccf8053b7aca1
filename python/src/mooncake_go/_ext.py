"""ctypes declarations of the C ABI 1.3 additions (include/mooncake.h:
ranged reads, get sessions, replica descriptors) and 1.4 (put sessions).

They live apart from _lib so that the prototypes of the base ABI stay in
one place; they bind to the same loaded library (one Go runtime), on first
use, and need a library of ABI 1.3 or later (1.4 for put sessions).
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, Structure, c_char, c_char_p, c_int32, c_size_t, c_uint64, c_void_p

from . import _lib, errors

ABI_MINOR = 3
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


_ERR = POINTER(_lib.Error)
_CPP = POINTER(c_char_p)
_VPP = POINTER(c_void_p)
_U64P = POINTER(c_uint64)
_I32P = POINTER(c_int32)
_SZP = POINTER(c_size_t)

_SIGNATURES = {
    "mc_store_batch_get_ranges": [c_uint64, _CPP, _VPP, _U64P, _U64P, _SZP, c_size_t, _U64P, _I32P],
    "mc_store_batch_get_session_start": [c_uint64, _CPP, c_size_t, _I32P],
    "mc_store_batch_get_session_end": [c_uint64, _CPP, c_size_t],
    "mc_store_get_replicas": [c_uint64, c_char_p, POINTER(ReplicaDesc), c_size_t, _SZP],
    "mc_store_batch_put_session_start": [c_uint64, _CPP, _U64P, c_size_t, POINTER(_lib.ReplicateConfig), _I32P],
    "mc_store_batch_put_ranges": [c_uint64, _CPP, _VPP, _U64P, _U64P, _SZP, c_size_t, _U64P, _I32P],
    "mc_store_batch_put_session_end": [c_uint64, _CPP, c_size_t, _I32P],
    "mc_store_batch_put_session_revoke": [c_uint64, _CPP, c_size_t, _I32P],
}

# The minor version each function needs, where it is above ABI_MINOR.
_NEEDS = {name: 4 for name in _SIGNATURES if "put_session" in name or name == "mc_store_batch_put_ranges"}


class _Ext:
    """The 1.3 functions, bound at first use (loading the library then, as
    _lib does)."""

    _lock = threading.Lock()

    def __getattr__(self, name):
        if name not in _SIGNATURES:
            raise AttributeError(name)
        with self._lock:
            if name not in self.__dict__:
                v = _lib.lib.mc_abi_version()
                need = _NEEDS.get(name, ABI_MINOR)
                if v & 0xFFFF < need:
                    raise errors.MooncakeError(
                        -600, errors.DOMAIN_STORE, "INVALID_PARAMS",
                        f"{name} needs libmooncake ABI 1.{need}; {_lib.lib._name} has 1.{v & 0xFFFF}")
                fn = getattr(_lib.lib._cdll, name)
                fn.restype = c_int32
                fn.argtypes = _SIGNATURES[name] + [_ERR]
                self.__dict__[name] = fn
        return self.__dict__[name]


ext = _Ext()
__all__ = ["ext", "ReplicaDesc", "REPLICA_MEMORY", "REPLICA_DISK", "REPLICA_LOCAL_DISK"]
