"""The plugin's settings: LMCache's extra_config keys
``remote_storage_plugin.<plugin name>.<setting>``, beside the
``module_path`` and ``class_name`` LMCache itself reads there.

A plugin instance named ``mooncake_go.b`` reads its own keys first, then
those of ``mooncake_go``, so several instances can share a master and
differ in one setting.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

from mooncake_go import parse_size as _parse_size

#: The plugin type LMCache routes to this adapter: remote_storage_plugins
#: entries "mooncake_go" or "mooncake_go.<instance>".
PLUGIN_TYPE = "mooncake_go"

#: Keys under the plugin's prefix that LMCache reads, not us.
_LMCACHE_KEYS = {"module_path", "class_name"}


def parse_size(v: Any, name: str) -> int:
    """Bytes from an int or a string like "64MB", "1GiB", "512k": every unit
    1024-based, as Mooncake reads them (mooncake_go's one parser, which the
    CLI agrees with)."""
    try:
        return _parse_size(v)
    except ValueError as e:
        raise ValueError(f"mooncake-go lmcache plugin: {name}: {e}") from e


def _bool(v: Any, name: str) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"mooncake-go lmcache plugin: {name}={v!r} is not a boolean")


@dataclass
class Settings:
    """What the plugin needs; every field but master has a default."""

    #: the store master, host:port (or etcd://h1:2379;h2:2379 for HA).
    master: str = ""
    #: memory this process lends the pool; 0 lends none, so chunks live
    #: on the pool's other members and outlive this LMCache instance.
    segment_size: int = 0
    #: the store client's staging memory (LMCache's pool is registered,
    #: so the chunks never pass through it).
    local_buffer_size: int = 16 << 20
    #: the address this client's engine listens on [the engine picks].
    local_hostname: str = ""
    #: "tcp" or "shm" [the library's default].
    protocol: str = ""
    #: memory replicas per chunk.
    replicas: int = 1
    #: place replicas on this host's segments first.
    prefer_local: bool = False
    #: a batch is cut into up to this many slices moved at once (the
    #: store checksums and copies one slice on one thread).
    streams: int = 1
    #: slices are at least this many bytes: smaller batches go whole.
    stream_min_bytes: int = 8 << 20
    #: seconds one store call may take (master RPC and transfer deadline).
    timeout: float = 10.0
    #: seconds the store is left alone after it failed: calls meanwhile
    #: answer "absent" at once instead of waiting on a dead master.
    retry: float = 5.0

    @classmethod
    def from_extra_config(cls, extra: Optional[Mapping[str, Any]], plugin_name: str) -> "Settings":
        """The settings of plugin instance plugin_name; unknown keys under
        its prefix are refused (a typo would otherwise pass silently)."""
        extra = extra or {}
        names = [plugin_name]
        if plugin_name.split(".", 1)[0] != plugin_name:
            names.append(plugin_name.split(".", 1)[0])
        known = {f.name for f in fields(cls)}
        raw: dict = {}
        for name in reversed(names):  # the instance's own keys win
            prefix = f"remote_storage_plugin.{name}."
            for k, v in extra.items():
                if not k.startswith(prefix):
                    continue
                setting = k[len(prefix):]
                if setting in _LMCACHE_KEYS:
                    continue
                if setting not in known:
                    raise ValueError(f"mooncake-go lmcache plugin: unknown setting {k!r} "
                                     f"(known: {', '.join(sorted(known))})")
                raw[setting] = v
        s = cls()
        for k, v in raw.items():
            if k in ("segment_size", "local_buffer_size", "stream_min_bytes"):
                v = parse_size(v, k)
            elif k in ("replicas", "streams"):
                v = int(v)
            elif k == "prefer_local":
                v = _bool(v, k)
            elif k in ("timeout", "retry"):
                v = float(v)
            else:
                v = str(v)
            setattr(s, k, v)
        if not s.master:
            raise ValueError(f"mooncake-go lmcache plugin: extra_config needs "
                             f"remote_storage_plugin.{names[-1]}.master (the store master, host:port)")
        if s.replicas < 1 or s.streams < 1 or s.timeout <= 0 or s.retry < 0:
            raise ValueError(f"mooncake-go lmcache plugin: replicas and streams must be >= 1, timeout > 0 and "
                             f"retry >= 0 (got {s.replicas}, {s.streams}, {s.timeout}, {s.retry})")
        return s
