"""mooncake_go.connectors.sglang (connectors/sglang): see README.md there."""
