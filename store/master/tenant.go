package master

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Tenants. Every object belongs to one tenant, named by the client that
// put it; two tenants may use the same key without ever seeing each
// other's object. A client names its tenant in the gRPC metadata of each
// call (TenantMetadataKey); one that names none, a client older than
// tenants included, is DefaultTenant's.
//
// The Service keeps one key space: a key of a tenant other than the
// default is stored under "\x00<tenant>\x00<key>" (scopeKey). A default
// key is stored as it is, so a master without tenants, its journal and its
// snapshots, read the same; the one default key that would clash, one that
// starts with a NUL byte, is stored as "\x00\x00<key>". The journal thus
// records the tenant with every key, and a new leader that replays it keeps
// the tenants apart without anything more.

// DefaultTenant is the tenant of a caller that names none, as Mooncake's.
const DefaultTenant = storepb.DefaultTenant

// TenantMetadataKey is the gRPC metadata key a client sends its tenant in.
const TenantMetadataKey = storepb.TenantMetadataKey

// CheckTenant refuses a tenant id that is empty, too long, or has a byte
// other than an ASCII letter, digit, or one of "-_.:@/".
func CheckTenant(t string) error {
	if err := storepb.CheckTenant(t); err != nil {
		return fmt.Errorf("master: %w", err)
	}
	return nil
}

// scopeKey is the Service's key of tenant t's key.
func scopeKey(t, key string) string {
	if t == DefaultTenant || t == "" {
		if key == "" || key[0] != 0 {
			return key
		}
		t = "" // "\x00\x00<key>": the default tenant's, escaped
	}
	return "\x00" + t + "\x00" + key
}

// splitKey is the tenant and the client's key of a Service key.
func splitKey(sk string) (tenant, key string) {
	if sk == "" || sk[0] != 0 {
		return DefaultTenant, sk
	}
	i := strings.IndexByte(sk[1:], 0)
	if i < 0 { // not made by scopeKey: the default tenant's
		return DefaultTenant, sk
	}
	if tenant = sk[1 : 1+i]; tenant == "" {
		tenant = DefaultTenant
	}
	return tenant, sk[2+i:]
}

// clientKey is a Service key in messages: formatted (%q, %s), it is the
// key its tenant's clients sent, without the tenant's prefix.
type clientKey string

func (k clientKey) String() string {
	_, key := splitKey(string(k))
	return key
}

// tenantOfKey is the tenant of a Service key.
func tenantOfKey(sk string) string {
	t, _ := splitKey(sk)
	return t
}

// callerTenant is the tenant a gRPC call names in its metadata;
// DefaultTenant when it names none. An invalid one is InvalidArgument.
func callerTenant(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(TenantMetadataKey)
	if len(vals) == 0 || vals[0] == "" {
		return DefaultTenant, nil
	}
	if len(vals) > 1 {
		return "", status.Errorf(codes.InvalidArgument, "master: %d tenant ids in one call (%s)", len(vals), TenantMetadataKey)
	}
	if err := CheckTenant(vals[0]); err != nil {
		return "", status.Error(codes.InvalidArgument, err.Error())
	}
	return vals[0], nil
}

// scopeKeys is scopeKey of every key, in a new slice.
func scopeKeys(t string, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = scopeKey(t, k)
	}
	return out
}

// TenantKeys returns tenant t's readable keys, sorted, as its clients name
// them.
func (s *Service) TenantKeys(t string) []string {
	return tenantKeys(t, s.readableKeys())
}

// RemoveTenant removes tenant t's readable objects, skipping leased ones
// unless force, and returns how many it removed; the journal's error says
// a new leader may not know of the removals.
func (s *Service) RemoveTenant(ctx context.Context, t string, force bool) (int, error) {
	return s.removeMatching(ctx, func(sk string) bool { return tenantOfKey(sk) == t }, force)
}

// RemoveTenantByRegex is RemoveByRegex within tenant t: the pattern is
// matched against t's keys as its clients name them.
func (s *Service) RemoveTenantByRegex(ctx context.Context, t, expr string, force bool) (int, error) {
	re, err := compileRemoveRegex(expr)
	if err != nil {
		return 0, err
	}
	return s.removeMatching(ctx, func(sk string) bool {
		tt, k := splitKey(sk)
		return tt == t && re.MatchString(k)
	}, force)
}

// tenantKeys keeps tenant t's keys of the Service keys sks, as its clients
// name them, in place.
func tenantKeys(t string, sks []string) []string {
	out := sks[:0]
	for _, sk := range sks {
		if tt, k := splitKey(sk); tt == t {
			out = append(out, k)
		}
	}
	return out
}
