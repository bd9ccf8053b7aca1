"""Turning what callers pass for memory into (address, length).

Accepted everywhere a buffer is taken:
  * an ``int``: a raw address (a length must be given);
  * an object with ``data_ptr()`` (a torch tensor): its data, of
    ``numel() * element_size()`` bytes (or ``nbytes``); it must be
    contiguous, in CPU or CUDA memory (the library finds a device pointer
    by asking the CUDA driver the process loaded, and moves its bytes
    with the driver only);
  * an object with ``__array_interface__`` (a numpy array): its data, of
    ``nbytes``; it must be C-contiguous;
  * any object with the buffer protocol (bytearray, memoryview, mmap,
    array.array, bytes for reads of it only): its memory, which must be
    contiguous.

The caller keeps the object alive for as long as the library may use the
memory (registered regions: until unregistered; transfers: until they end).
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple, Union

Buffer = Union[int, Any]


def copy(dst: Buffer, src: Buffer, length: Optional[int] = None) -> None:
    """Copies length bytes (all of src by default) from src to dst, each a
    buffer or an address of this process, in host or CUDA memory: the
    library copies GPU memory with the CUDA driver, never with the CPU."""
    from . import _lib

    s, n = address(src, length)
    d, _ = address(dst, n, writable=True)
    _lib.call(_lib.lib.mc_copy, d, s, n)


def address(obj: Buffer, length: Optional[int] = None, *, writable: bool = False) -> Tuple[int, int]:
    """The (address, length) of obj; length, when given, must fit in obj."""
    if isinstance(obj, int):
        if obj < 0:
            raise ValueError(f"negative address {obj}")
        if length is None:
            raise TypeError("a raw address needs a length")
        return obj, int(length)
    addr, size = _resolve(obj, writable)
    if length is None:
        return addr, size
    length = int(length)
    if length < 0 or length > size:
        raise ValueError(f"length {length} does not fit in a buffer of {size} bytes")
    return addr, length


def _resolve(obj: Any, writable: bool) -> Tuple[int, int]:
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr):  # torch.Tensor and look-alikes
        device = getattr(obj, "device", None)
        if device is not None and getattr(device, "type", "cpu") not in ("cpu", "cuda"):
            # Memory the library can reach neither with the CPU nor with
            # the CUDA driver.
            raise ValueError(f"tensor on {device}: only CPU and CUDA memory are supported")
        contiguous = getattr(obj, "is_contiguous", None)
        if callable(contiguous) and not contiguous():
            raise ValueError("tensor is not contiguous")
        nbytes = getattr(obj, "nbytes", None)
        if nbytes is None:
            nbytes = obj.numel() * obj.element_size()
        return int(data_ptr()), int(nbytes)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:  # numpy.ndarray and look-alikes
        flags = getattr(obj, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            raise ValueError("array is not C-contiguous")
        ptr, readonly = ai["data"]
        if writable and readonly:
            raise ValueError("array is read-only")
        return int(ptr), int(obj.nbytes)
    if isinstance(obj, ctypes.Array):
        return ctypes.addressof(obj), ctypes.sizeof(obj)
    mv = memoryview(obj)
    if not mv.contiguous:
        raise ValueError("buffer is not contiguous")
    n = mv.nbytes
    if mv.readonly:
        if writable:
            raise ValueError("buffer is read-only")
        if isinstance(obj, bytes):
            # bytes objects are immutable and their data never moves.
            return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0, n
        raise ValueError("read-only buffers other than bytes are not accepted; pass bytes or a writable buffer")
    if n == 0:
        return 0, 0
    return ctypes.addressof((ctypes.c_char * n).from_buffer(mv.cast("B"))), n


def to_bytes_pointer(value: Any) -> Tuple[Any, int]:
    """A ctypes-passable pointer to value's bytes and its length, for
    values the library only reads during the call (puts)."""
    if isinstance(value, bytes):
        return value, len(value)
    if isinstance(value, str):
        b = value.encode()
        return b, len(b)
    if isinstance(value, int):
        raise TypeError("a value must be bytes-like, not an address; use put_from")
    try:
        return address(value)
    except ValueError:
        b = bytes(memoryview(value))
        return b, len(b)
