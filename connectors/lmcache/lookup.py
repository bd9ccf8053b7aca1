"""A lookup client (LMCache's LookupClientInterface) that answers "how
many leading tokens of this prompt does the store hold" with one batch
exists of the prompt's chunk keys, from a store client of its own that
lends no memory. It sees what the plugin's connector stored: both derive
the keys with LMCache's own token database."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from lmcache.v1.lookup_client.abstract_client import LookupClientInterface
from lmcache.v1.token_database import ChunkedTokenDatabase

from mooncake_go import MooncakeError

from .config import PLUGIN_TYPE, Settings
from .connector import leading_true
from .link import StoreLink, logger


class MooncakeGoLookupClient(LookupClientInterface):
    """Settings come from the plugin's extra_config keys
    (``remote_storage_plugin.<plugin_name>.master``, ...); settings= gives
    them directly. The store is reached on first use, so a scheduler
    starts even while the store is down (lookups then hit nothing)."""

    def __init__(self, config, metadata, plugin_name: str = PLUGIN_TYPE, settings: Optional[Settings] = None):
        if config.enable_blending:
            raise ValueError("mooncake-go lookup client: blending is not supported")
        settings = settings or Settings.from_extra_config(config.extra_config, plugin_name)
        self.settings = dataclasses.replace(settings, segment_size=0)  # a scheduler lends the pool nothing
        self.token_database = ChunkedTokenDatabase(config, metadata)
        self._link = StoreLink(self.settings)

    def lookup(self, token_ids, lookup_id: Optional[str] = None,
               request_configs: Optional[dict] = None) -> Optional[int]:
        ends: List[int] = []
        keys: List[str] = []
        for _, end, key in self.token_database.process_tokens(token_ids, request_configs=request_configs):
            ends.append(end)
            keys.append(key.to_string())
        if not keys:
            return 0
        store = self._link.get()
        if store is None:
            return 0
        try:
            hits = leading_true(store.batch_exists(keys))
        except MooncakeError as e:
            self._link.failed(store, e)
            logger.warning("mooncake-go lookup client: exists of %d chunks failed: %s", len(keys), e)
            return 0
        return ends[hits - 1] if hits else 0

    def supports_producer_reuse(self) -> bool:
        return True

    def close(self) -> None:
        self._link.close()
