package master

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// scopeKey and splitKey are inverses, and no two (tenant, key) pairs share
// a Service key.
func TestScopeKey(t *testing.T) {
	tests := []struct {
		tenant, key string
		want        string // the Service key
	}{
		{"default", "k", "k"},                           // the default tenant's keys are stored as they are
		{"", "k", "k"},                                  // no tenant is the default one
		{"a", "k", "\x00a\x00k"},                        // another tenant's carry it
		{"a", "\x00b\x00k", "\x00a\x00\x00b\x00k"},      // a key that looks scoped stays the tenant's
		{"default", "\x00a\x00k", "\x00\x00\x00a\x00k"}, // a default key that would clash with a's k is escaped
		{"a", "", "\x00a\x00"},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		sk := scopeKey(tt.tenant, tt.key)
		assert.Equal(t, tt.want, sk, "%q %q", tt.tenant, tt.key)
		tenant, key := splitKey(sk)
		wantTenant := tt.tenant
		if wantTenant == "" {
			wantTenant = DefaultTenant
		}
		assert.Equal(t, wantTenant, tenant, "%q", sk)
		assert.Equal(t, tt.key, key, "%q", sk)
		assert.True(t, ownedBy(sk, wantTenant), "%q", sk)
		if prev, dup := seen[sk]; dup && prev != wantTenant+"/"+tt.key {
			t.Errorf("%q is both %s and %s/%s", sk, prev, wantTenant, tt.key)
		}
		seen[sk] = wantTenant + "/" + tt.key
	}
	assert.False(t, ownedBy("\x00ab\x00k", "a"))
	assert.False(t, ownedBy("\x00a\x00k", DefaultTenant))
}

// withTenant is ctx naming tenant in its outgoing gRPC metadata.
func withTenant(ctx context.Context, tenant string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, TenantMetadataKey, tenant)
}

// A WatchObjects stream sees its tenant's keys only, named as its clients
// name them; an invalid tenant id is refused.
func TestWatchObjectsPerTenant(t *testing.T) {
	f := newGRPCFixture(t)
	f.mount(t)
	put(t, f.svc, "c1", "k", 64, nil)
	put(t, f.svc, "c1", scopeKey("a", "k"), 64, nil)
	put(t, f.svc, "c1", scopeKey("a", "only-a"), 64, nil)
	watch := func(tenant string) storepb.Master_WatchObjectsClient {
		ctx := f.ctx
		if tenant != "" {
			ctx = withTenant(ctx, tenant)
		}
		s, err := f.c.WatchObjects(ctx, &storepb.WatchObjectsRequest{})
		require.NoError(t, err)
		return s
	}
	keys := func(s storepb.Master_WatchObjectsClient) []string {
		var out []string
		for synced := false; !synced; {
			resp, err := s.Recv()
			require.NoError(t, err)
			for _, ev := range resp.Events {
				out = append(out, ev.Key)
			}
			synced = resp.Synced
		}
		return out
	}
	a, d := watch("a"), watch("")
	assert.ElementsMatch(t, []string{"k", "only-a"}, keys(a))
	assert.Equal(t, []string{"k"}, keys(d))

	// Changes: each stream sees its own tenant's.
	put(t, f.svc, "c1", scopeKey("b", "x"), 64, nil) // neither's
	put(t, f.svc, "c1", scopeKey("a", "new"), 64, nil)
	put(t, f.svc, "c1", "new-d", 64, nil)
	resp, err := a.Recv()
	require.NoError(t, err)
	require.Len(t, resp.Events, 1)
	assert.Equal(t, "new", resp.Events[0].Key)
	resp, err = d.Recv()
	require.NoError(t, err)
	require.Len(t, resp.Events, 1)
	assert.Equal(t, "new-d", resp.Events[0].Key)

	_, err = watch("bad tenant").Recv()
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
}

// KV events carry the object's tenant and the key as its client names it.
func TestKVEventsCarryTenant(t *testing.T) {
	m, svc := startKVMaster(t, KVEventsConfig{BackendID: "pool-a", ModelName: "llama", BlockSize: 16})
	sub := subscribeKV(t, m, "", "")
	require.NoError(t, svc.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))
	put(t, svc, "c1", scopeKey("acme", "12345"), 64, nil)
	put(t, svc, "c1", "12345", 64, nil)
	require.NoError(t, svc.Remove(t.Context(), scopeKey("acme", "12345"), true))

	evs, _ := sub.events(3)
	want := []struct{ tenant, kind string }{{"acme", "stored"}, {"default", "stored"}, {"acme", "removed"}}
	for i, ev := range evs {
		assert.Equal(t, want[i].tenant, ev.TenantID, "event %d", i)
		assert.Equal(t, want[i].kind, ev.EventType, "event %d", i)
		assert.Equal(t, "12345", ev.ObjectKey, "event %d: the client's key", i)
		assert.Equal(t, []uint64{12345}, ev.SeqHashes, "event %d: the block of the client's key", i)
	}
}

// The key length limit applies to the client's key, not to its tenant's
// prefix.
func TestTenantKeyLimit(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{MaxKeyLen: 8})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))
	put(t, s, "c1", scopeKey(strings.Repeat("t", 100), "12345678"), 64, nil)
	_, err := s.PutStart(t.Context(), "c1", scopeKey("a", "123456789"), 64, nil)
	require.ErrorIs(t, err, storepb.ErrInvalidParams)
}

// Quotas in a file survive the master: Set writes the file, and a master
// that takes the lead (a new Service) reads what it holds then, changes
// another master made to it since its own start included.
func TestTenantQuotaFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quotas.yaml")
	require.NoError(t, os.WriteFile(path, []byte("version: 1\ntenants:\n  - tenant_id: a\n    quota: 2KiB\n"), 0o644))
	q1, err := NewTenantQuotas(FileQuotaStore{Path: path})
	require.NoError(t, err)
	q2, err := NewTenantQuotas(FileQuotaStore{Path: path}) // another master's, loaded at its start
	require.NoError(t, err)
	got, ok := q2.Quota("a")
	require.True(t, ok)
	assert.Equal(t, uint64(2048), got)

	require.NoError(t, q1.Set("b", 4096))
	_, err = q1.Delete("a")
	require.NoError(t, err)
	s, _ := newTestService(t, ServiceConfig{Tenants: q2}) // q2's master leads
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))
	put(t, s, "c1", scopeKey("a", "k"), 8192, nil) // a's quota is gone
	_, err = s.PutStart(t.Context(), "c1", scopeKey("b", "x"), 8192, nil)
	require.ErrorIs(t, err, storepb.ErrTenantQuotaExceeded, "b's quota, set by the other master")

	for _, bad := range []string{"version: 2\ntenants: []\n", "version: 1\ntenants:\n  - tenant_id: a\n    quota: lots\n",
		"version: 1\ntenants:\n  - tenant_id: 'a b'\n    quota: 1\n"} {
		require.NoError(t, os.WriteFile(path, []byte(bad), 0o644))
		_, err := NewTenantQuotas(FileQuotaStore{Path: path})
		assert.Error(t, err, "%q", bad)
	}
}

// lagJournal makes records durable only when waited for, as a journal in
// etcd does some time after the append.
type lagJournal struct {
	mu      sync.Mutex
	n       uint64
	pending []func()
}

var _ journal = (*lagJournal)(nil)

func (j *lagJournal) append(_ *storepb.JournalRecord, done func()) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.n++
	if done != nil {
		j.pending = append(j.pending, done)
	}
	return j.n
}

func (j *lagJournal) wait(context.Context, uint64) error {
	j.mu.Lock()
	p := j.pending
	j.pending = nil
	j.mu.Unlock()
	for _, f := range p {
		f()
	}
	return nil
}

func (j *lagJournal) last() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.n
}

// Under HA the room a tenant's own eviction makes comes back only once the
// drops are durable: its put waits for that, and does not find the pool
// full and evict another tenant's (older) objects instead.
func TestTenantEvictionWaitsForItsRoom(t *testing.T) {
	quotas, err := NewTenantQuotas(nil)
	require.NoError(t, err)
	const unit = 64 << 10
	require.NoError(t, quotas.Set("a", 2*unit))
	s, clock := newTestService(t, ServiceConfig{Tenants: quotas})
	s.j = &lagJournal{}
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 4*unit)))
	for _, k := range []string{scopeKey("b", "old1"), scopeKey("b", "old2"), scopeKey("a", "a1"), scopeKey("a", "a2")} {
		put(t, s, "c1", k, unit, nil)
		clock.Advance(time.Second)
	}
	// The pool is full, and a is at its quota: a3 evicts a1.
	put(t, s, "c1", scopeKey("a", "a3"), unit, nil)
	for _, k := range []string{"old1", "old2"} {
		ok, err := s.ExistKey(scopeKey("b", k))
		require.NoError(t, err)
		assert.True(t, ok, "b's %s was evicted for a's put", k)
	}
	ok, err := s.ExistKey(scopeKey("a", "a1"))
	require.NoError(t, err)
	assert.False(t, ok, "a1 should have made room for a3")
}
