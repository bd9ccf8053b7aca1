package main

import (
	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/store/master"
)

// addPersistFlags adds the flags of a master's state across restarts.
func addPersistFlags(f *pflag.FlagSet) {}

// persistConfig reads the persistence flags into cfg.
func persistConfig(s *settings, cfg *master.ServerConfig) error { return nil }
