package storepb

import (
	"fmt"
	"strings"
)

// Tenants travel outside the messages: a client names its tenant in the
// gRPC metadata of every call to the master, under TenantMetadataKey, so
// that a client older than tenants, which sends none, is DefaultTenant's.

// DefaultTenant is the tenant of a caller that names none, as Mooncake's.
const DefaultTenant = "default"

// TenantMetadataKey is the gRPC metadata key a client sends its tenant in.
const TenantMetadataKey = "mooncake-tenant-id"

// MaxTenantLen is the longest tenant id accepted, in bytes.
const MaxTenantLen = 128

// CheckTenant refuses a tenant id that is empty, longer than MaxTenantLen,
// or has a byte other than an ASCII letter, digit, or one of "-_.:@/" (a
// gRPC metadata value and a Prometheus label carry it as it is).
func CheckTenant(t string) error {
	switch {
	case t == "":
		return fmt.Errorf("empty tenant id")
	case len(t) > MaxTenantLen:
		return fmt.Errorf("tenant id of %d bytes is over the limit of %d bytes", len(t), MaxTenantLen)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.:@/", c) >= 0) {
			return fmt.Errorf("tenant id %q has the byte %q (letters, digits and -_.:@/ only)", t, c)
		}
	}
	return nil
}
