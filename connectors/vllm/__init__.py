"""MooncakeGoConnector: a vLLM v1 KV connector over mooncake_go.

Two tiers in one connector (see README.md):

* store tier: full KV blocks are saved to Mooncake Store under keys made
  of vLLM's block hashes and loaded by any instance that misses them;
* prefill/decode (PD): a prefill instance keeps a request's blocks after
  prefill and answers with kv_transfer_params naming them; the decode
  instance reads them with one Transfer Engine batch READ and tells the
  prefill instance to free them.

vLLM loads it with::

    --kv-transfer-config '{"kv_connector": "MooncakeGoConnector",
      "kv_connector_module_path": "mooncake_go.connectors.vllm", ...}'

Importing this package imports vLLM (only vLLM imports it).
"""

from .connector import MooncakeGoConnector, MooncakeGoHandshake, MooncakeGoMetadata

__all__ = ["MooncakeGoConnector", "MooncakeGoMetadata", "MooncakeGoHandshake"]
