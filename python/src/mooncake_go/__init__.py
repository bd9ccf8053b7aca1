"""mooncake_go: the Python API of mooncake-go.

Two objects, over libmooncake.so (the Go C ABI, loaded with ctypes):

* :class:`TransferEngine` moves bytes between registered memory of this
  process and segments of other engines, in batches;
* :class:`Store` is a client of the distributed KV-cache store.

Both take buffers as raw addresses, numpy arrays, torch tensors
(``data_ptr()``) or any buffer-protocol object; both raise
:class:`~mooncake_go.errors.MooncakeError` subclasses; both are context
managers and safe to use from several threads. Every call into the library
releases the GIL for its duration.

The official Mooncake Python API (``mooncake.engine.TransferEngine``,
``mooncake.store.MooncakeDistributedStore``) is provided by the ``mooncake``
package of this distribution, on top of this one, with this package's
public names only: :func:`address` (what a buffer argument resolves to)
and :func:`parse_size` (sizes as Mooncake spells them) are public for it
and for connectors.
"""

from . import errors
from ._buffers import Buffer, address, copy
from ._lib import live_handles
from ._size import parse_size
from .engine import LOCAL_SEGMENT, Notify, Op, Request, RequestArray, SharedBuffer, State, Status, TransferEngine
from .errors import MooncakeError
from .store import Replicate, Store
from .dummy import DummyStore, alloc_shared, free_shared

__version__ = "0.1.0"


def __getattr__(name):
    # Asking for these loads the library (see _lib._Library).
    if name == "abi_version":
        return _lib.lib.mc_abi_version()
    if name == "library_path":
        return _lib.lib._name
    raise AttributeError(name)


from . import _lib  # noqa: E402

__all__ = [
    "TransferEngine",
    "Store",
    "Replicate",
    "Request",
    "RequestArray",
    "SharedBuffer",
    "Op",
    "State",
    "Status",
    "Notify",
    "LOCAL_SEGMENT",
    "MooncakeError",
    "errors",
    "abi_version",
    "library_path",
    "live_handles",
    "address",
    "copy",
    "parse_size",
    "Buffer",
    "DummyStore",
    "alloc_shared",
    "free_shared",
]
