"""Exceptions raised by mooncake_go, one class per status code of the C ABI.

Every failed call raises a :class:`MooncakeError` carrying the status
``code`` (numbered as Mooncake's: the Transfer Engine's error.h for engine
calls, the Store's ErrorCode for store calls, -9000 and below for the C ABI
itself), the ``domain`` that numbering belongs to, the code's ``name`` and
the library's message. Catch the subclasses for the cases a caller handles
(``ObjectNotFound``, ``NoAvailableHandle``, ``TimedOut``, ...), or
``MooncakeError`` for all of them.
"""

from __future__ import annotations

# Domains (MC_DOMAIN_*).
DOMAIN_NONE, DOMAIN_ABI, DOMAIN_ENGINE, DOMAIN_STORE = 0, 1, 2, 3

# The ABI's own codes (MC_ERR_*), shared by both domains of calls.
INVALID_HANDLE = -9001
NULL_ARGUMENT = -9002
PANIC = -9003
BUFFER_TOO_SMALL = -9004
TIMED_OUT = -9005
STRUCT_SIZE = -9006
TRANSFER_FAILED = -9007
CANCELED = -9008


class MooncakeError(Exception):
    """A failed call: ``code``, ``domain``, ``name`` and ``message``."""

    def __init__(self, code: int, domain: int = DOMAIN_NONE, name: str = "", message: str = ""):
        self.code = code
        self.domain = domain
        self.name = name or str(code)
        self.message = message
        super().__init__(f"{self.name} ({code}): {message}" if message else f"{self.name} ({code})")


class EngineError(MooncakeError):
    """A Transfer Engine error (codes of Mooncake's error.h)."""


class StoreError(MooncakeError):
    """A Store error (codes of Mooncake's ErrorCode)."""


# The ABI's own conditions.
class InvalidHandle(MooncakeError):
    """The engine or store was closed (or the handle was never valid)."""


class NullArgument(MooncakeError, ValueError):
    """A required pointer was NULL."""


class Panic(MooncakeError):
    """The library recovered from an internal panic; the process is fine."""


class BufferTooSmall(MooncakeError, ValueError):
    """An output buffer was smaller than the result."""


class TimedOut(MooncakeError, TimeoutError):
    """A wait ran out of time before the batch finished, or a store call
    ran past the store's ``op_timeout_ms``."""


class Canceled(MooncakeError):
    """The handle was closed while the call was in progress."""


class TransferFailed(EngineError):
    """A transfer task failed (a finer engine code, when known, is ``code``)."""


# Transfer Engine codes with a class of their own.
class InvalidArgument(EngineError, ValueError):
    pass


class AddressNotRegistered(EngineError, ValueError):
    pass


class AddressOverlapped(EngineError, ValueError):
    pass


class BatchBusy(EngineError):
    pass


class EngineClosed(EngineError):
    """MC_TE_ERR_CONTEXT: the engine is closed, or its context ended."""


# Store codes with a class of their own.
class ObjectNotFound(StoreError, LookupError):
    pass


class ObjectAlreadyExists(StoreError):
    """A put of a key that exists (Mooncake's OBJECT_ALREADY_EXISTS,
    -705); the value stored is left as it is."""


class ObjectHasLease(StoreError):
    pass


class NoAvailableHandle(StoreError):
    """The pool is full (Mooncake's NO_AVAILABLE_HANDLE, -200)."""


class TenantQuotaExceeded(StoreError):
    """The put would take its tenant over its quota (Mooncake's
    TENANT_QUOTA_EXCEEDED, -1700); the message names the tenant and the
    quota."""


class InvalidParams(StoreError, ValueError):
    pass


class StoreTransferFailed(StoreError):
    pass


class RPCError(StoreError):
    """The master could not be reached or did not answer in time."""


_ABI = {
    INVALID_HANDLE: InvalidHandle,
    NULL_ARGUMENT: NullArgument,
    PANIC: Panic,
    BUFFER_TOO_SMALL: BufferTooSmall,
    TIMED_OUT: TimedOut,
    STRUCT_SIZE: MooncakeError,
    TRANSFER_FAILED: TransferFailed,
    CANCELED: Canceled,
}
_ENGINE = {
    -1: InvalidArgument,
    -3: AddressNotRegistered,
    -4: BatchBusy,
    -7: AddressOverlapped,
    -202: EngineClosed,
}
_STORE = {
    -200: NoAvailableHandle,
    -600: InvalidParams,
    -704: ObjectNotFound,
    -705: ObjectAlreadyExists,
    -706: ObjectHasLease,
    -800: StoreTransferFailed,
    -900: RPCError,
    -901: RPCError,
    -1700: TenantQuotaExceeded,
}


def from_status(code: int, domain: int, name: str = "", message: str = "") -> MooncakeError:
    """The exception for a status code of a domain."""
    if domain == DOMAIN_ABI or code in _ABI:
        cls = _ABI.get(code, MooncakeError)
    elif domain == DOMAIN_ENGINE:
        cls = _ENGINE.get(code, EngineError)
    elif domain == DOMAIN_STORE:
        cls = _STORE.get(code, StoreError)
    else:
        cls = MooncakeError
    return cls(code, domain, name, message)
