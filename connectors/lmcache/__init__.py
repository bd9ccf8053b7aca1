"""mooncake_go.connectors.lmcache (connectors/lmcache): an LMCache remote
storage plugin over mooncake_go.Store, and a lookup client. Configuration
and figures: README.md. LMCache loads the plugin with::

    remote_storage_plugins: ["mooncake_go"]
    extra_config:
      remote_storage_plugin.mooncake_go.module_path: mooncake_go.connectors.lmcache
      remote_storage_plugin.mooncake_go.class_name: MooncakeGoAdapter
      remote_storage_plugin.mooncake_go.master: "10.0.0.1:50051"

Importing this package imports LMCache (only LMCache imports it).
"""

from .config import PLUGIN_TYPE, Settings
from .connector import MooncakeGoAdapter, MooncakeGoConnector
from .lookup import MooncakeGoLookupClient

__all__ = ["MooncakeGoAdapter", "MooncakeGoConnector", "MooncakeGoLookupClient", "Settings", "PLUGIN_TYPE"]
