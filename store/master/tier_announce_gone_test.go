package master

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// An SSD tier's file still holds the bytes of values the master removed
// or replaced since (its node is not told of frees). Mounted again after
// the node's restart, it must not bring them back: a removed key stays
// removed, a replaced value never comes back in place of the newer one
// (which was evicted meanwhile). A value merely evicted, or put again
// after its removal, is taken.
func TestMountDiskRefusesGoneValues(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	putSum := func(key string, sum uint32, upsert bool) {
		start := s.PutStart
		if upsert {
			start = s.UpsertStart
		}
		_, err := start(ctx, "a", key, 100, nil)
		require.NoError(t, err)
		require.NoError(t, s.PutEnd(ctx, "a", key, sum))
	}
	drop := func(key string) { // evicted: no SSD copy, no room on a tier
		sh := s.shardOf(key)
		sh.mu.Lock()
		s.evictLocked(sh, key, sh.objects[key], true)
		sh.mu.Unlock()
	}
	putSum("removed", 1, false)
	require.NoError(t, s.Remove(ctx, "removed", true))
	putSum("replaced", 2, false)
	putSum("replaced", 3, true)
	drop("replaced")
	putSum("evicted", 4, false)
	drop("evicted")
	putSum("again", 5, false)
	require.NoError(t, s.Remove(ctx, "again", true))
	putSum("again", 5, false)
	drop("again")

	disk := seg("2", 64<<20, 4096)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	taken, err := s.MountDisk(ctx, "b", disk, []*storepb.DiskObject{
		{Key: "removed", Offset: 0, Size: 100, Checksum: 1},
		{Key: "replaced", Offset: 128, Size: 100, Checksum: 2},
		{Key: "evicted", Offset: 256, Size: 100, Checksum: 4},
		{Key: "again", Offset: 384, Size: 100, Checksum: 5},
	})
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false, true, true}, taken)
	ok, err := s.ExistKey("removed")
	require.NoError(t, err)
	assert.False(t, ok, "a removed key came back")
}

// A value the master forgot (evicted, or lost with its segment) that a new
// put of its key replaced is gone too: it must not come back once the new
// value is evicted in its turn. One evicted and never replaced comes back.
func TestMountDiskRefusesForgottenReplacedValues(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	putSum := func(key string, sum uint32) {
		_, err := s.PutStart(ctx, "a", key, 100, nil)
		require.NoError(t, err)
		require.NoError(t, s.PutEnd(ctx, "a", key, sum))
	}
	drop := func(key string) {
		sh := s.shardOf(key)
		sh.mu.Lock()
		s.evictLocked(sh, key, sh.objects[key], true)
		sh.mu.Unlock()
	}
	putSum("evicted", 1)
	drop("evicted")
	putSum("evicted", 2)
	drop("evicted")
	putSum("lost", 3)
	require.NoError(t, s.UnmountSegment(ctx, "a", "1")) // lost goes with it
	require.NoError(t, s.MountSegment(ctx, "a", seg("3", 8<<20, 1<<20)))
	putSum("lost", 4)
	drop("lost")
	putSum("kept", 5)
	drop("kept")

	disk := seg("2", 64<<20, 4096)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	taken, err := s.MountDisk(ctx, "c", disk, []*storepb.DiskObject{
		{Key: "evicted", Offset: 0, Size: 100, Checksum: 1},
		{Key: "lost", Offset: 128, Size: 100, Checksum: 3},
		{Key: "kept", Offset: 256, Size: 100, Checksum: 5},
	})
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false, true}, taken)
}
