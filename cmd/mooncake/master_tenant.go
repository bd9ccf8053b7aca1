package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/store/master"
)

// addTenantFlags adds the master's tenant flags, official mooncake_master's
// names (docs/tenants.md).
func addTenantFlags(f *pflag.FlagSet) {
	f.Bool("enable_multi_tenants", false, "admit puts against tenant quotas (tenants' keys are kept apart always; "+
		"a client that names no tenant is \"default\")")
	f.String("tenant_quota_connector_type", "file", "where the tenant quotas are kept: \"file\" (a YAML file) only here")
	f.String("tenant_quota_connector_uri", "", "the tenant quota file (YAML: version: 1, tenants: [{tenant_id, quota}]); "+
		"loaded at start, rewritten by PUT/DELETE /api/v1/tenant_quotas. Empty: quotas set over HTTP live in memory only")
}

// tenantConfig reads the tenant flags into cfg.
func tenantConfig(s *settings, cfg *master.ServerConfig) error {
	uri, typ := s.str("tenant_quota_connector_uri"), s.str("tenant_quota_connector_type")
	if !s.boolean("enable_multi_tenants") {
		if uri != "" {
			slog.Warn("master: --tenant_quota_connector_uri has no effect without --enable_multi_tenants; tenants are kept apart, without quotas")
		}
		return nil
	}
	if typ != "" && typ != "file" {
		return fmt.Errorf("--tenant_quota_connector_type %q: only \"file\" here", typ)
	}
	var store master.QuotaStore
	if uri != "" {
		store = master.FileQuotaStore{Path: uri}
	}
	quotas, err := master.NewTenantQuotas(store)
	if err != nil {
		return fmt.Errorf("--tenant_quota_connector_uri %q: %w", uri, err)
	}
	cfg.Service.Tenants = quotas
	return nil
}
