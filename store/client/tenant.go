package client

import (
	"cmp"
	"context"
	"fmt"
	"os"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// tenantOf is the tenant a client of Config.TenantID t belongs to: t, else
// MOONCAKE_TENANT_ID, else none named (""), which the master reads as
// storepb.DefaultTenant. A tenant from the environment is checked as
// Validate checks t.
func tenantOf(t string) (string, error) {
	t = cmp.Or(t, os.Getenv("MOONCAKE_TENANT_ID"))
	if t == "" {
		return "", nil
	}
	if err := storepb.CheckTenant(t); err != nil {
		return "", fmt.Errorf("client: tenant (Config.TenantID or MOONCAKE_TENANT_ID): %w", err)
	}
	return t, nil
}

// tenantCredentials names the client's tenant in the metadata of every
// call to the master, streams included.
type tenantCredentials string

func (t tenantCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{storepb.TenantMetadataKey: string(t)}, nil
}

// RequireTransportSecurity is false: a tenant is a name, not a secret
// (the Token authenticates), and it goes over plaintext as the keys do.
func (tenantCredentials) RequireTransportSecurity() bool { return false }
