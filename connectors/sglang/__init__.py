"""mooncake_go.connectors.sglang (connectors/sglang): SGLang's HiCache
storage tier on a mooncake-go store. Configuration and figures: README.md.

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
      '{"backend_name": "mooncake-go", "module_path": "mooncake_go.connectors.sglang",
        "class_name": "MooncakeGoHiCache", "interface_v1": 1, "master": "127.0.0.1:50051"}'
"""

from .backend import MooncakeGoHiCache, Settings
from .keys import key_prefix, page_id64, page_key

__all__ = ["MooncakeGoHiCache", "Settings", "key_prefix", "page_id64", "page_key"]
