package client

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/logtest"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// offloadAll puts n objects of size bytes through node (they fit its DRAM)
// and waits until each has its SSD copy.
func offloadAll(t *testing.T, m *master.Server, node *Client, n, size int) {
	t.Helper()
	ctx := ctxT(t)
	for i := range n {
		require.NoError(t, node.Put(ctx, fmt.Sprintf("s%d", i), value(uint64(i), size), nil))
	}
	require.Eventually(t, func() bool { return m.Service().Stats().Offloaded >= uint64(n) }, 10*time.Second, 10*time.Millisecond)
}

// A node restarted on its SSD directory brings the objects of its tier
// back into the pool: after it left (its DRAM replicas and tier gone from
// the pool), a new process on the same directory mounts the tier with
// them, and every one reads back byte-exact from another client.
func TestSSDTierSurvivesNodeRestart(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	dir := t.TempDir()
	const n, size = 10, 256 << 10
	node := newClient(t, m.Addr(), 4<<20, withSSD(dir, 16<<20))
	path := node.SSDPath()
	offloadAll(t, m, node, n, size)
	require.NoError(t, node.Close())
	reader := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	_, err := reader.Get(ctx, "s0")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound, "the node left: nothing of it serves")

	node2 := newClient(t, m.Addr(), 4<<20, withSSD(dir, 16<<20))
	assert.Equal(t, path, node2.SSDPath(), "the restarted node takes its tier file again")
	for i := range n {
		got, err := reader.Get(ctx, fmt.Sprintf("s%d", i))
		require.NoError(t, err, "s%d", i)
		require.True(t, bytes.Equal(value(uint64(i), size), got), "s%d", i)
	}
	// The tier goes on: a new object spills next to the old ones, and a
	// second restart keeps both.
	require.NoError(t, node2.Put(ctx, "new", value(99, size), nil))
	require.Eventually(t, func() bool { return m.Service().Stats().Offloaded >= uint64(n+1) }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, node2.Close())
	newClient(t, m.Addr(), 4<<20, withSSD(dir, 16<<20))
	for i, key := range []string{"s3", "new"} {
		got, err := reader.Get(ctx, key)
		require.NoError(t, err, key)
		require.True(t, bytes.Equal(value([]uint64{3, 99}[i], size), got), key)
	}
}

// Bytes of the tier file damaged while the node was down: the restarted
// node drops that object with a log line and does not offer it; the
// others come back.
func TestSSDTierRestartDropsDamaged(t *testing.T) {
	logs := logtest.Capture(t)
	m := startMaster(t, master.ServiceConfig{})
	dir := t.TempDir()
	const n, size = 6, 256 << 10
	node := newClient(t, m.Addr(), 4<<20, withSSD(dir, 16<<20))
	path := node.SSDPath()
	offloadAll(t, m, node, n, size)
	require.NoError(t, node.Close())

	idx, err := loadIndex(strings.TrimSuffix(path, ".seg") + ".idx")
	require.NoError(t, err)
	off, ok := idx.byKey["s2"]
	require.True(t, ok, "s2 is in the tier's index")
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("not the bytes that were put"), int64(off)+1000)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	newClient(t, m.Addr(), 4<<20, withSSD(dir, 16<<20))
	assert.Contains(t, logs.String(), "SSD object damaged")
	assert.Contains(t, logs.String(), "key=s2")
	reader := newClient(t, m.Addr(), NoSegment)
	ctx := ctxT(t)
	for i := range n {
		key := fmt.Sprintf("s%d", i)
		got, err := reader.Get(ctx, key)
		if i == 2 {
			require.ErrorIs(t, err, storepb.ErrObjectNotFound, "the damaged object is not served")
			continue
		}
		require.NoError(t, err, key)
		require.True(t, bytes.Equal(value(uint64(i), size), got), key)
	}
}

// A key put again with another value while its node was down keeps the
// new value: the stale bytes on the restarted node's tier are not taken.
func TestSSDTierRestartKeepsNewerValue(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	dir := t.TempDir()
	const size = 256 << 10
	node := newClient(t, m.Addr(), 4<<20, withSSD(dir, 16<<20))
	offloadAll(t, m, node, 2, size)
	require.NoError(t, node.Close())
	other := newClient(t, m.Addr(), 4<<20)
	ctx := ctxT(t)
	require.NoError(t, other.Put(ctx, "s0", value(42, size), nil))

	newClient(t, m.Addr(), 4<<20, withSSD(dir, 16<<20))
	got, err := other.Get(ctx, "s0")
	require.NoError(t, err)
	require.True(t, bytes.Equal(value(42, size), got), "the newer value")
	got, err = other.Get(ctx, "s1")
	require.NoError(t, err)
	require.True(t, bytes.Equal(value(1, size), got))
}

// A node with an SSD tier outlives a master restarted without a journal:
// told to remount, it mounts its DRAM segment and its tier again (again),
// and the new master holds both from new replicas and copies for the
// remount hold, while it takes the tier's objects at once.
func TestNodeWithTierRemountedHeld(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() }) // the one running then
	addr := m.Addr()
	node := newClient(t, addr, 8<<20, withSSD(t.TempDir(), 8<<20))
	offloadAll(t, m, node, 4, 4096)
	require.Zero(t, m.Service().Stats().HeldSegments, "a first mount is held")

	require.NoError(t, m.Close())
	m, err = master.Start(master.ServerConfig{Listen: addr})
	require.NoError(t, err)
	// The tier's objects are taken at once.
	require.Eventually(t, func() bool { st := m.Service().Stats(); return st.Segments == 2 && st.Keys == 4 },
		5*time.Second, 10*time.Millisecond)
	assert.Equal(t, 2, m.Service().Stats().HeldSegments, "the DRAM segment and the tier, mounted again")
}
