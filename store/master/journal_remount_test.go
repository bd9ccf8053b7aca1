package master

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// A client the master expired comes back and mounts its segment again,
// same id (a long pause: the master asks it to remount). The objects the
// expiry took from that segment stay gone in a replay of the journal too:
// a restarted master or a new leader must not find them again in the
// segment, where newer objects may have their space.
func TestReplayAfterExpiryAndRemount(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	put(t, s, "a", "before", 4096, nil)
	clock.Advance(s.cfg.ClientTTL + time.Second)
	require.Equal(t, 1, s.ExpireClients())
	ok, err := s.ExistKey("before")
	require.NoError(t, err)
	require.False(t, ok, "the expiry took the object with its segment")

	require.NoError(t, s.ReMountSegment(ctx, "a", []*storepb.Segment{seg("1", 1<<20, 1<<20)}, true))
	clock.Advance(s.cfg.RemountHold)   // held after the remount until then
	put(t, s, "a", "after", 4096, nil) // the space before had
	want := view(s)

	st := newState()
	for _, r := range j.recs {
		require.NoError(t, st.apply(r))
	}
	s2, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s2.restore(st), "the journal restores")
	assert.Equal(t, want, view(s2))
}

// A snapshot taken between a client's expiry and the sweep of its
// segments leaves out the replicas on them: restored, with the records
// after it (the segment mounted again, same id, and a new object where an
// old one was), it holds the new object only.
func TestSnapshotBetweenExpiryAndSweep(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	put(t, s, "a", "before", 4096, nil)
	// ExpireClients up to its sweep.
	s.segMu.Lock()
	for _, sg := range s.clients["a"].segs {
		s.removeSegLocked(sg)
	}
	delete(s.clients, "a")
	s.record(&storepb.JournalRecord{Op: &storepb.JournalRecord_Expire{Expire: &storepb.JournalExpire{ClientId: "a"}}})
	s.segMu.Unlock()
	chunks, seq := s.snapshot(snapChunkObjs)
	s.sweepDead()

	require.NoError(t, s.ReMountSegment(ctx, "a", []*storepb.Segment{seg("1", 1<<20, 1<<20)}, true))
	clock.Advance(s.cfg.RemountHold)
	put(t, s, "a", "after", 4096, nil)
	want := view(s)

	assert.Equal(t, want, view(restoredAfter(t, chunks, j.recs[seq:])))
}

// A record can name a segment after the record of its unmount (a put's
// space taken just before the expiry of the segment's client, its start
// recorded just after; the leader's sweep then dropped it). Replayed, such
// a replica is dropped too, or the segment mounted again with the same id
// would hold it over a newer object's space.
func TestReplayDropsReplicasOnUnmountedSegments(t *testing.T) {
	mount := &storepb.JournalRecord{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{
		ClientId: "a", Segment: seg("1", 1<<20, 1<<20)}}}
	start := func(key string) *storepb.JournalRecord { // on a's segment
		return &storepb.JournalRecord{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{ClientId: "b", Key: key, Size: 4096,
			Replicas: []*storepb.ReplicaLocation{{SegmentId: "1", Offset: 0, Size: 4096}}}}}
	}
	disk := seg("2", 64<<20, 1<<20)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	st := newState()
	for _, r := range []*storepb.JournalRecord{
		mount,
		{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{ClientId: "b", Segment: disk}}},
		start("spilled"),
		{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{ClientId: "b", Key: "spilled"}}},
		{Op: &storepb.JournalRecord_Expire{Expire: &storepb.JournalExpire{ClientId: "a"}}},
		start("late"), // allocated before the expiry, recorded after
		{Op: &storepb.JournalRecord_Move{Move: &storepb.JournalMove{Key: "spilled", // a drain's move onto a segment gone
			From: &storepb.ReplicaLocation{SegmentId: "2", Size: 4096}, To: &storepb.ReplicaLocation{SegmentId: "1", Offset: 8192, Size: 4096}}}},
		mount, // a is back, same segment id
		start("after"),
		{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{ClientId: "b", Key: "after"}}},
	} {
		require.NoError(t, st.apply(r))
	}
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.restore(st), "the journal restores")
	keys := s.readableKeys()
	assert.Equal(t, []string{"after"}, keys)
	assert.Error(t, s.PutEnd(t.Context(), "b", "late", 1), "late's start, swept by the leader, is not in flight")
}
