"""Framework connectors over mooncake_go. Their sources live in the
repository's connectors/ directory (connectors/vllm is
mooncake_go.connectors.vllm); each imports its framework, so nothing here
is imported with mooncake_go."""
