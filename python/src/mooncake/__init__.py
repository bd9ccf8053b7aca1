"""mooncake: Mooncake's Python API (mooncake.engine, mooncake.store) served
by mooncake-go.

This package replaces the official ``mooncake`` distribution
(mooncake-transfer-engine and its variants): install one or the other in
an environment, never both. Other distributions may still add their own
``mooncake.*`` modules (the path is extended as the original's is).
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

IMPLEMENTATION = "mooncake-go"
