"""mooncake_go.connectors.lmcache (connectors/lmcache): see README.md there."""
