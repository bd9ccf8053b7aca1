package master

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A service prepared by a follower long before it takes over gives its
// objects leases, and its puts in flight start times, from the takeover:
// eviction and the reclaim take nothing readers or writers of the old
// leader may still be using.
func TestPreparedServiceLeasesFromTakeover(t *testing.T) {
	src, _ := newTestService(t, ServiceConfig{Shards: 2})
	j := &memJournal{}
	src.j = j
	require.NoError(t, src.MountSegment(t.Context(), "c1", seg("1", 0, 10*1024)))
	for _, k := range []string{"a", "b", "c"} {
		put(t, src, "c1", k, 1024, nil)
	}
	_, err := src.PutStart(t.Context(), "c1", "inflight", 1024, nil)
	require.NoError(t, err)
	st := newState()
	for _, r := range j.recs {
		require.NoError(t, st.apply(r))
	}
	prepared, clk := newTestService(t, ServiceConfig{Shards: 2})
	require.NoError(t, prepared.restore(st)) // follower.prepare
	clk.Advance(time.Hour)                   // the old leader lived on
	prepared.refresh()                       // takeOver
	now := clk.Now()
	for i := range prepared.shards {
		for key, o := range prepared.shards[i].objects {
			require.True(t, o.lease.After(now), "%q: no lease at the takeover", key)
		}
	}
	checkEvictOrder(t, prepared)
	prepared.needEvict.Store(true)
	require.Zero(t, prepared.Evict(), "evicted objects old readers may be copying")
	require.Zero(t, prepared.ReclaimPuts(), "reclaimed a put in flight its writer may still end")
}
