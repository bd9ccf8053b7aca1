package main

import (
	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/store/master"
)

// addTenantFlags adds the master's tenant flags (quotas).
func addTenantFlags(f *pflag.FlagSet) {}

// tenantConfig reads the tenant flags into cfg.
func tenantConfig(s *settings, cfg *master.ServerConfig) error { return nil }
