"""SSD offload as Mooncake's setup() takes it, for mooncake.store.

Official ``setup(..., enable_ssd_offload=True, ssd_offload_path=...)`` (or
the same keys of a config dict) gives the client a local SSD tier. The
library reads its tier from the environment when a store is made
(capi/store_ssd.go: MOONCAKE_ENABLE_SSD_OFFLOAD, the path in
MOONCAKE_OFFLOAD_FILE_STORAGE_PATH, the size in
MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES), so setup's arguments are put
there for the duration of the store's creation and the environment is
given back as it was. Without enable_ssd_offload the environment decides,
as a process configured by MOONCAKE_* variables expects.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator, Optional

ENABLE = "MOONCAKE_ENABLE_SSD_OFFLOAD"
PATH = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"

# Position of enable_ssd_offload in official setup()'s arguments
# (local_hostname ... master_server_addr, engine, enable_ssd_offload,
# ssd_offload_path).
_ENABLE_ARG = 8

_lock = threading.Lock()  # one store creation at a time changes the environment


def _truthy(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def from_setup(args: tuple, kwargs: dict) -> "tuple[bool, str]":
    """(enable_ssd_offload, ssd_offload_path) of a setup() call."""
    if len(args) == 1 and isinstance(args[0], dict):
        c = args[0]
    elif not args and isinstance(kwargs.get("config"), dict):
        c = kwargs["config"]
    else:
        c = dict(kwargs)
        if len(args) > _ENABLE_ARG:
            c.setdefault("enable_ssd_offload", args[_ENABLE_ARG])
        if len(args) > _ENABLE_ARG + 1:
            c.setdefault("ssd_offload_path", args[_ENABLE_ARG + 1])
    return _truthy(c.get("enable_ssd_offload", False)), str(c.get("ssd_offload_path") or "")


@contextlib.contextmanager
def environment(enable: bool, path: str) -> Iterator[Optional[str]]:
    """Sets the library's offload variables from setup()'s arguments while
    the block runs; yields an error message instead when they are unusable."""
    if not enable:
        yield None
        return
    path = path or os.environ.get(PATH, "")
    if not path:
        yield "enable_ssd_offload needs ssd_offload_path (or MOONCAKE_OFFLOAD_FILE_STORAGE_PATH)"
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        yield f"ssd_offload_path {path!r}: {e}"
        return
    with _lock:
        saved = {k: os.environ.get(k) for k in (ENABLE, PATH)}
        os.environ[ENABLE], os.environ[PATH] = "1", path
        try:
            yield None
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
