package client

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func withSSD(dir string, size int64) func(*Config) {
	return func(c *Config) { c.SSDDir, c.SSDSize, c.PingInterval = dir, size, 50*time.Millisecond }
}

// Objects evicted from a full DRAM pool spill to the SSD tier and stay
// readable byte-exact; a hit on an SSD-only object promotes it back.
func TestSSDSpillAndPromote(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSD(t.TempDir(), 64<<20))
	reader := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	require.NotEmpty(t, node.SSDPath())

	const n, size = 40, 256 << 10 // 10 MiB through a 4 MiB pool
	for i := range n {
		require.NoError(t, node.Put(ctx, fmt.Sprintf("s%d", i), value(uint64(i), size), nil))
		// At a put rate the node's copies keep up with (a faster one makes
		// puts that find no room drop objects not yet copied).
		require.Eventually(t, func() bool {
			st := m.Service().Stats()
			return st.Offloaded+st.Spilled >= uint64(i+1)
		}, 10*time.Second, 5*time.Millisecond, "offloads: %+v", m.Service().Stats())
	}
	st := m.Service().Stats()
	t.Logf("after the puts: %+v", st)
	assert.Equal(t, n, st.Keys, "nothing dropped while the tier has room")
	assert.Positive(t, st.EvictedKeys, "DRAM replicas were evicted")

	for i := range n {
		got, err := reader.Get(ctx, fmt.Sprintf("s%d", i))
		require.NoError(t, err, "s%d", i)
		require.Equal(t, value(uint64(i), size), got, "s%d", i)
	}
	// Reading SSD-only objects queued promotions; they land in DRAM.
	require.Eventually(t, func() bool { return m.Service().Stats().Promoted > 0 }, 10*time.Second, 10*time.Millisecond)
	reps, _, _, _, err := m.Service().GetReplicaList("s0")
	require.NoError(t, err)
	var media []storepb.Medium
	for _, r := range reps {
		media = append(media, r.GetMemory().Medium)
	}
	t.Logf("s0 replicas after a hit: %v; stats %+v", media, m.Service().Stats())
	for i := range n {
		got, err := reader.Get(ctx, fmt.Sprintf("s%d", i))
		require.NoError(t, err)
		require.Equal(t, value(uint64(i), size), got)
	}
}

// A tier too small degrades to plain eviction: objects that do not fit are
// dropped (not found), never served wrong.
func TestSSDFullDegradesToEviction(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSD(t.TempDir(), 1<<20))
	ctx := ctxT(t)
	const n, size = 40, 256 << 10
	for i := range n {
		require.NoError(t, node.Put(ctx, fmt.Sprintf("f%d", i), value(uint64(i), size), nil))
	}
	// Evictions run inline when a put finds no room and in the master's
	// loop; wait until some object has gone before reading.
	require.Eventually(t, func() bool { st := m.Service().Stats(); return st.Keys < n && st.EvictedKeys > 0 },
		10*time.Second, 5*time.Millisecond, "nothing evicted: %+v", m.Service().Stats())
	found, missing := 0, 0
	for i := range n {
		got, err := node.Get(ctx, fmt.Sprintf("f%d", i))
		if err != nil {
			require.ErrorIs(t, err, storepb.ErrObjectNotFound)
			missing++
			continue
		}
		require.Equal(t, value(uint64(i), size), got)
		found++
	}
	t.Logf("%d found, %d evicted; %+v", found, missing, m.Service().Stats())
	assert.Positive(t, missing)
	assert.Positive(t, m.Service().Stats().EvictedKeys)
}

// A failing disk (bytes damaged under the mapping) gives checksum errors,
// never wrong bytes.
func TestSSDDamageIsCaught(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSD(t.TempDir(), 64<<20))
	ctx := ctxT(t)
	const n, size = 30, 256 << 10
	for i := range n {
		require.NoError(t, node.Put(ctx, fmt.Sprintf("d%d", i), value(uint64(i), size), nil))
	}
	require.Eventually(t, func() bool { return m.Service().Stats().Offloaded > 5 }, 10*time.Second, 10*time.Millisecond)
	// Overwrite the whole file through the file system.
	f, err := os.OpenFile(node.SSDPath(), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(make([]byte, 64<<20), 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	bad := 0
	for i := range n {
		got, err := node.Get(ctx, fmt.Sprintf("d%d", i))
		if errors.Is(err, storepb.ErrObjectNotFound) {
			continue // evicted before its offload: a put found no room
		}
		if err != nil {
			assert.ErrorIs(t, err, storepb.ErrChecksumMismatch)
			bad++
			continue
		}
		require.Equal(t, value(uint64(i), size), got, "d%d", i)
	}
	assert.Positive(t, bad)
}

// A tier that cannot be allocated leaves a working client without one.
func TestSSDUnavailable(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	c := newClient(t, m.Addr(), 4<<20, withSSD(t.TempDir(), 1<<50))
	assert.Empty(t, c.SSDPath())
	require.NoError(t, c.Put(ctxT(t), "k", []byte("v"), nil))
	c2 := newClient(t, m.Addr(), 4<<20, withSSD("/nonexistent/dir", 1<<20))
	assert.Empty(t, c2.SSDPath())
}
