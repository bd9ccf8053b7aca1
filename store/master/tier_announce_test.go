package master

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// MountDisk takes the objects an SSD tier's file offers unless the master
// knows the key with another value, or the offer is malformed; what it
// takes is readable, journaled, and holds its bytes; a repeat changes
// nothing.
func TestMountDiskTakesWhatFits(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	for key, sum := range map[string]uint32{"same": 5, "other": 6} {
		_, err := s.PutStart(ctx, "a", key, 100, nil)
		require.NoError(t, err)
		require.NoError(t, s.PutEnd(ctx, "a", key, sum))
	}
	disk := seg("2", 64<<20, 4096)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	objs := []*storepb.DiskObject{
		{Key: "new", Offset: 0, Size: 100, Checksum: 9},      // unknown key: a new object
		{Key: "same", Offset: 128, Size: 100, Checksum: 5},   // same value: one more replica
		{Key: "other", Offset: 256, Size: 100, Checksum: 7},  // another value: stale
		{Key: "overlap", Offset: 320, Size: 10, Checksum: 1}, // inside other's span
		{Key: "unaligned", Offset: 1001, Size: 8, Checksum: 1},
		{Key: "outside", Offset: 4000, Size: 200, Checksum: 1},
		{Key: "new", Offset: 2048, Size: 100, Checksum: 9}, // the key again
	}
	taken, err := s.MountDisk(ctx, "b", disk, objs, false)
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, false, false, false, false, false}, taken)

	// Journaled: a replay rebuilds the same state. (Before any read: a read
	// of an object only on SSD queues its promotion, which is not durable.)
	want := view(s)
	st := newState()
	for _, r := range j.recs {
		require.NoError(t, st.apply(r))
	}
	s2, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s2.restore(st))
	assert.Equal(t, want, view(s2))

	_, _, sum, n, err := s.GetReplicaList("new")
	require.NoError(t, err)
	assert.Equal(t, uint32(9), sum)
	assert.Equal(t, uint64(100), n)
	reps, _, sum, _, err := s.GetReplicaList("same")
	require.NoError(t, err)
	assert.Equal(t, uint32(5), sum)
	assert.Len(t, reps, 2, "DRAM replica and the SSD copy")
	_, _, sum, _, err = s.GetReplicaList("other")
	require.NoError(t, err)
	assert.Equal(t, uint32(6), sum, "the newer value stays")
	s.segMu.Lock()
	used := s.segs["2"].alloc.Used()
	s.segMu.Unlock()
	assert.Equal(t, uint64(256), used, "the taken objects' spans, and only those, are allocated")

	// Repeated (its answer lost): nothing changes, the answer is the same.
	again, err := s.MountDisk(ctx, "b", disk, objs, false)
	require.NoError(t, err)
	assert.Equal(t, taken, again)
	_, err = s.MountDisk(ctx, "c", disk, objs, false)
	assert.ErrorIs(t, err, storepb.ErrInvalidParams, "another client's segment")
}
