"""One store client of the plugin, made on first use and remade after the
store failed: a master that went away (restarted, partitioned) is left
alone for ``retry`` seconds, during which callers get None at once and
answer "absent" or fail their put, instead of each waiting out an RPC
deadline on a dead address."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from mooncake_go import MooncakeError, Store, TransferEngine, errors

from .config import Settings

logger = logging.getLogger("lmcache.mooncake_go")

# Per-key errors that say the store (master, node or network) failed, as
# opposed to answers about the key itself (absent, exists, pool full).
_DOWN = (errors.RPCError, errors.TimedOut, errors.TransferFailed, errors.StoreTransferFailed,
         errors.InvalidHandle, errors.Panic)


def store_down(e: BaseException) -> bool:
    """Whether an error of a store call means the store itself failed."""
    return isinstance(e, _DOWN)


class StoreLink:
    """The store client, its engine, and the regions registered with it.
    ``on_new`` runs with every new client, before anyone else uses it
    (the connector registers LMCache's pool there)."""

    def __init__(self, settings: Settings, on_new: Optional[Callable[[Store], None]] = None):
        self.settings = settings
        self._on_new = on_new
        self._lock = threading.Lock()
        self._store: Optional[Store] = None
        self._engine: Optional[TransferEngine] = None
        self._down_until = 0.0
        self._closed = False

    def open(self) -> Store:
        """The client, made now if need be; raises what made it fail."""
        with self._lock:
            if self._closed:
                raise RuntimeError("mooncake-go lmcache plugin: the store link is closed")
            if self._store is None:
                self._make_locked()
            return self._store  # type: ignore[return-value]

    def get(self) -> Optional[Store]:
        """The client, or None while the store is (recently) down."""
        with self._lock:
            if self._store is not None or self._closed:
                return self._store
            if time.monotonic() < self._down_until:
                return None
            try:
                self._make_locked()
            except (MooncakeError, OSError) as e:
                self._drop_locked(e)
            return self._store

    def failed(self, store: Store, e: BaseException) -> None:
        """Reports that a call on store failed with e; a failure of the
        store itself drops the client (if it is still the current one)."""
        if not store_down(e):
            return
        with self._lock:
            if self._store is store:
                self._drop_locked(e)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._release_locked()

    def _make_locked(self) -> None:
        s = self.settings
        timeout_ms = int(s.timeout * 1000)
        eng = TransferEngine(host=s.local_hostname or None, timeout_ms=timeout_ms)
        try:
            store = Store(s.master, segment_size=s.segment_size if s.segment_size > 0 else -1,
                          local_buffer_size=s.local_buffer_size, local_hostname=s.local_hostname or None,
                          protocol=s.protocol or None, rpc_timeout_ms=timeout_ms, engine=eng)
        except BaseException:
            eng.close()
            raise
        try:
            if self._on_new is not None:
                self._on_new(store)
        except BaseException:
            store.close()
            eng.close()
            raise
        self._store, self._engine = store, eng

    def _drop_locked(self, e: BaseException) -> None:
        logger.warning("mooncake-go lmcache plugin: store at %s unavailable (%s); retrying in %.1f s",
                       self.settings.master, e, self.settings.retry)
        self._down_until = time.monotonic() + self.settings.retry
        self._release_locked()

    def _release_locked(self) -> None:
        # The store before its engine: the engine must outlive the store.
        store, self._store = self._store, None
        eng, self._engine = self._engine, None
        for h in (store, eng):
            if h is not None:
                try:
                    h.close()
                except MooncakeError as e:
                    logger.warning("mooncake-go lmcache plugin: closing %r: %s", h, e)
