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
	}, false)
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
	}, false)
	require.NoError(t, err)
	assert.Equal(t, []bool{false, false, true}, taken)
}

// A shard remembers the last value of the maxGoneValues keys it forgot
// most recently, each key once (its newest value); a key known again
// (put anew) is forgotten there, and its old value, if another, is gone.
func TestGoneValuesLast(t *testing.T) {
	var g goneValues
	assert.False(t, g.has("k", 1, 1), "nothing forgotten yet")
	g.known("k", 1, 1)
	g.forgot("k", 1, 1)
	assert.False(t, g.has("k", 1, 1), "the last value may come back")
	assert.True(t, g.has("k", 2, 1), "no other")
	g.forgot("k", 2, 2)
	assert.True(t, g.has("k", 1, 1), "forgotten again: the newest is the last")
	assert.False(t, g.has("k", 2, 2))

	// Known again with another value: the forgotten one is gone.
	g.known("k", 3, 3)
	assert.True(t, g.has("k", 2, 2))
	assert.False(t, g.has("k", 3, 3))
	// Known again with the same value: nothing is gone.
	g.forgot("j", 1, 1)
	g.known("j", 1, 1)
	assert.False(t, g.has("j", 1, 1))
	assert.False(t, g.has("j", 9, 9), "j has no last value now")

	// Past the bound the oldest go first; a key forgotten twice holds one
	// place, at its newest.
	g.forgot("a", 1, 1)
	g.forgot("b", 1, 1)
	g.forgot("a", 1, 1)
	for i := range maxGoneValues - 1 {
		g.forgot(string(rune('0'+i%10))+"/"+string(rune(i)), 1, 1)
	}
	assert.False(t, g.has("b", 9, 9), "b, the oldest, went")
	assert.True(t, g.has("a", 9, 9), "a, forgotten again, stayed")
	g.forgot("x", 1, 1)
	assert.False(t, g.has("a", 9, 9), "then a")
}
