package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Reads within a lease skip the master; the client's own upserts and
// removals invalidate, and a cached read that fails looks up afresh.
func TestLeaseCache(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 8<<20)
	b := newClient(t, m.Addr(), 8<<20)
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "k", value(1, 4096), nil))
	_, err := b.Get(ctx, "k")
	require.NoError(t, err)
	require.NotNil(t, b.leases.get("k", time.Now()), "the lookup is cached")

	// The master is not asked again: stop it; the cached read still works.
	// (Its lease protects the replicas, which live in a's segment.)
	require.NoError(t, b.Upsert(ctx, "k", value(2, 4096), nil))
	assert.Nil(t, b.leases.get("k", time.Now()), "an upsert invalidates")
	got, err := b.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, value(2, 4096), got)

	// Another client force-removes the object; b's cached list now points
	// at freed space. Reusing the space for another object makes the
	// cached read fail its checksum, and the fresh lookup says not found.
	require.NoError(t, a.Remove(ctx, "k", true))
	for i := range 64 {
		require.NoError(t, a.Put(ctx, "fill"+string(rune('a'+i%26))+string(rune('a'+i/26)), value(uint64(10+i), 4096), nil))
	}
	_, err = b.Get(ctx, "k")
	assert.ErrorIs(t, err, storepb.ErrObjectNotFound)
	assert.Nil(t, b.leases.get("k", time.Now()))

	// Entries end before their lease does.
	c := newLeaseCache(4)
	start := time.Now()
	c.put("x", &cached{start: start, ttlMs: 1000})
	assert.NotNil(t, c.get("x", start.Add(700*time.Millisecond)))
	assert.Nil(t, c.get("x", start.Add(800*time.Millisecond)))
	for i := range 10 {
		c.put(string(rune('a'+i)), &cached{start: start, ttlMs: 1000})
	}
	assert.LessOrEqual(t, len(c.entries), 4)
}
