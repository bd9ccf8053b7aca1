package master

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// A promotion from SSD gives the tenant DRAM without an admission; its
// next put still sees it, and evicts its own objects to stay within its
// quota instead of going over it.
func TestTenantQuotaCountsPromotions(t *testing.T) {
	quotas, err := NewTenantQuotas(nil)
	require.NoError(t, err)
	const unit = 64 << 10
	s, clock := newTestService(t, ServiceConfig{Tenants: quotas})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "c1", seg("1", 0x10000000, 16*unit)))
	disk := seg("2", 0x20000000, 16*unit)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, s.MountSegment(ctx, "c1", disk))

	// k1 goes to SSD and leaves DRAM.
	k1 := scopeKey("a", "k1")
	put(t, s, "c1", k1, unit, nil)
	tasks := s.takeTasks(t.Context(), "c1")
	require.Len(t, tasks, 1, "the put queues an offload")
	require.NoError(t, s.MoveEnd(ctx, "c1", tasks[0].Id, true))
	sh := s.shardOf(k1)
	sh.mu.Lock()
	s.evictLocked(sh, k1, sh.objects[k1], true)
	sh.mu.Unlock()

	require.NoError(t, quotas.Set("a", 2*unit))
	charged := func() uint64 {
		for _, u := range s.TenantUsage() {
			if u.Tenant == "a" {
				return u.Charged
			}
		}
		return 0
	}
	clock.Advance(time.Second)
	put(t, s, "c1", scopeKey("a", "k2"), unit, nil)
	require.Equal(t, uint64(unit), charged())

	// A read of k1 brings it back into DRAM.
	clock.Advance(time.Second)
	_, _, _, _, err = s.GetReplicaList(k1)
	require.NoError(t, err)
	promoted := false
	for _, task := range s.takeTasks(t.Context(), "c1") { // k2's offload, and k1's promotion
		promoted = promoted || task.Target.Medium == storepb.Medium_MEDIUM_DRAM
		require.NoError(t, s.MoveEnd(ctx, "c1", task.Id, true))
	}
	require.True(t, promoted, "the read queues a promotion")
	require.Equal(t, uint64(2*unit), charged())

	clock.Advance(time.Hour) // no lease left
	put(t, s, "c1", scopeKey("a", "k3"), unit, nil)
	assert.LessOrEqual(t, charged(), uint64(2*unit), "a's put took it over its quota")
}
