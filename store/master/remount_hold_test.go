package master

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mooncake-go/mooncake/internal/logtest"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// A segment that comes back through ReMountSegment unknown to the master
// (it restarted without a journal, or expired the client) takes no new
// replicas for RemountHold: clients may still write into space granted
// before. Other segments take them; once the hold has run out, it does.
func TestRemountedSegmentHeld(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	require.NoError(t, s.ReMountSegment(ctx, "b", []*storepb.Segment{seg("2", 4<<20, 1<<20)}, true))
	for i := range 8 {
		reps := put(t, s, "c", string(rune('k'+i)), 4096, nil)
		require.Len(t, reps, 1)
		assert.Equal(t, "node-1", mem(reps[0]).SegmentName, "put %d went to the held segment", i)
	}
	// Two replicas asked: only one segment may take one.
	reps := put(t, s, "c", "two", 4096, &storepb.ReplicateConfig{ReplicaNum: 2})
	assert.Len(t, reps, 1)
	// Striped: every piece on the segment not held.
	reps = put(t, s, "c", "striped", 4*minPiece, &storepb.ReplicateConfig{StripeCount: 2})
	require.Len(t, reps, 1)
	assert.Equal(t, "node-1", mem(reps[0]).SegmentName)
	for _, p := range mem(reps[0]).Stripes {
		assert.Equal(t, "node-1", p.SegmentName, "a piece went to the held segment")
	}

	// Nothing left but the held segment: no room, with the hold named.
	require.NoError(t, s.UnmountSegment(ctx, "a", "1"))
	_, err := s.PutStart(ctx, "c", "full", 4096, nil)
	require.ErrorIs(t, err, storepb.ErrNoAvailableHandle)
	assert.ErrorContains(t, err, "1 more held for up to")

	clock.Advance(DefaultRemountHold - time.Millisecond)
	_, err = s.PutStart(ctx, "c", "full", 4096, nil)
	require.ErrorIs(t, err, storepb.ErrNoAvailableHandle, "the hold lasts RemountHold")
	clock.Advance(time.Millisecond)
	reps = put(t, s, "c", "after", 4096, nil)
	assert.Equal(t, "node-2", mem(reps[0]).SegmentName)
}

// A segment the master has mounted, mounted again (a client told to
// remount that the master still knew, or a new leader that has the segment
// from the journal), keeps taking replicas; so does one a client mounts for
// the first time (again false: its first ReMountSegment, which registers
// it), and any with the hold off.
func TestRemountHoldOnlyForUnknownSegments(t *testing.T) {
	ctx := t.Context()
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	require.NoError(t, s.ReMountSegment(ctx, "a", []*storepb.Segment{seg("1", 1<<20, 1<<20)}, true))
	put(t, s, "a", "known", 4096, nil)

	first, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, first.ReMountSegment(ctx, "a", []*storepb.Segment{seg("1", 1<<20, 1<<20)}, false))
	put(t, first, "a", "first", 4096, nil)

	off, _ := newTestService(t, ServiceConfig{RemountHold: -1})
	require.NoError(t, off.ReMountSegment(ctx, "a", []*storepb.Segment{seg("1", 1<<20, 1<<20)}, true))
	put(t, off, "a", "off", 4096, nil)
}

// Spills and drains do not move objects into a held segment either: their
// copies would land where a client may still write.
func TestRemountHoldKeepsMovesOut(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	put(t, s, "c", "k", 4096, nil)
	require.NoError(t, s.ReMountSegment(ctx, "b", []*storepb.Segment{seg("2", 4<<20, 1<<20)}, true))

	// The owner's own segment first, as a move prefers: not while held.
	s.segMu.Lock()
	held := s.segs["2"]
	r, ok := s.allocOnLocked(storepb.Medium_MEDIUM_DRAM, "b", 4096)
	s.segMu.Unlock()
	require.True(t, ok, "segment 1 has room")
	assert.Equal(t, "1", r.seg.id, "a move went to the held segment")
	// Segment 1 drained: nowhere left for a move or a drain's copy.
	sh := s.shardOf("k")
	sh.mu.Lock() // a shard's lock before segMu, as everywhere
	s.segMu.Lock()
	s.segs["1"].drain = segDraining
	_, ok = s.allocOnLocked(storepb.Medium_MEDIUM_DRAM, "b", 4096)
	o := sh.objects["k"]
	_, drainOK := s.drainTargetLocked(o, o.replicas[0], []string{"node-1"}, nil)
	s.segMu.Unlock()
	sh.mu.Unlock()
	assert.False(t, ok, "a move went to the held segment")
	assert.False(t, drainOK, "a drain went to the held segment")

	clock.Advance(DefaultRemountHold)
	s.segMu.Lock()
	r, ok = s.allocOnLocked(storepb.Medium_MEDIUM_DRAM, "b", 4096)
	s.segMu.Unlock()
	require.True(t, ok)
	assert.Same(t, held, r.seg)
}

// The hold is in the mount's journal record and in snapshots: a new leader
// (or a master restored from its files) keeps the segment held for what is
// left of it.
func TestRemountHoldSurvivesFailover(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	require.NoError(t, s.ReMountSegment(ctx, "b", []*storepb.Segment{seg("2", 4<<20, 1<<20)}, true))
	clock.Advance(DefaultRemountHold / 2)
	chunks, _ := s.snapshot(snapChunkObjs)

	fromJournal := newState()
	for _, r := range j.recs {
		require.NoError(t, fromJournal.apply(r))
	}
	fromSnapshot := newState()
	for _, c := range chunks {
		require.NoError(t, fromSnapshot.loadChunk(c))
	}
	for name, st := range map[string]*state{"journal": fromJournal, "snapshot": fromSnapshot} {
		t.Run(name, func(t *testing.T) {
			s2, clock2 := newTestService(t, ServiceConfig{})
			clock2.Advance(DefaultRemountHold / 2)
			require.NoError(t, s2.restore(st))
			require.NoError(t, s2.UnmountSegment(ctx, "a", "1"))
			_, err := s2.PutStart(ctx, "c", "k", 4096, nil)
			require.ErrorIs(t, err, storepb.ErrNoAvailableHandle, "the new leader put into the held segment")
			clock2.Advance(DefaultRemountHold / 2)
			put(t, s2, "c", "k", 4096, nil)
		})
	}
}

// A put that only a held segment could take fails at once: it evicts
// nothing and leaves no eviction forced, which would take the first
// objects put once the hold ends (a master restarted without a journal has
// every segment held and nothing else to evict).
func TestRemountHoldForcesNoEviction(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.ReMountSegment(ctx, "b", []*storepb.Segment{seg("2", 4<<20, 1<<20)}, true))
	for i := range 3 {
		_, err := s.PutStart(ctx, "c", fmt.Sprint("early", i), 4096, nil)
		require.ErrorIs(t, err, storepb.ErrNoAvailableHandle)
	}
	assert.False(t, s.needEvict.Load(), "a refused put forced the next eviction")
	assert.Equal(t, 1, s.Stats().HeldSegments)

	clock.Advance(DefaultRemountHold)
	assert.Zero(t, s.Stats().HeldSegments)
	put(t, s, "c", "first", 4096, nil)
	s.Evict() // the Run loop's next round
	ok, err := s.ExistKey("first")
	require.NoError(t, err)
	assert.True(t, ok, "the first object put after the hold was evicted")
}

// Over gRPC, again marks the remount; the admin server's segment details
// show what is left of the hold, and the metrics count the segment held.
func TestRemountHoldOverGRPCAndAdmin(t *testing.T) {
	m, c := startAdminMaster(t, ServerConfig{})
	ctx := t.Context()
	for _, r := range []*storepb.ReMountSegmentRequest{
		{ClientId: "first", Segments: []*storepb.Segment{seg("1", 1<<20, 1<<20)}},
		{ClientId: "again", Segments: []*storepb.Segment{seg("2", 4<<20, 1<<20)}, Again: true},
	} {
		res, err := c.ReMountSegment(ctx, r)
		require.NoError(t, err)
		require.NoError(t, res.AsError())
	}
	var d struct {
		Segments []struct {
			ID     string `json:"segment_id"`
			HeldMs *int64 `json:"held_for_ms"`
		} `json:"segments"`
	}
	a := adminDo(t, m, "GET", "/get_segments_detail")
	require.NoError(t, json.Unmarshal([]byte(a.body), &d), a.body)
	require.Len(t, d.Segments, 2)
	for _, sg := range d.Segments {
		if sg.ID == "1" {
			assert.Nil(t, sg.HeldMs, "a first mount is not held")
			continue
		}
		require.NotNil(t, sg.HeldMs, a.body)
		assert.InDelta(t, DefaultRemountHold.Milliseconds(), *sg.HeldMs, 5000)
	}
	assert.Contains(t, adminDo(t, m, "GET", "/metrics").body, "master_held_segments 1")

	// An SSD tier mounted again over the Tier service is held too.
	conn, err := grpc.NewClient(m.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	tier := seg("3", 16<<20, 1<<20)
	tier.Medium = storepb.Medium_MEDIUM_DISK
	res, err := storepb.NewTierClient(conn).MountDisk(ctx, &storepb.MountDiskRequest{ClientId: "again", Segment: tier, Again: true})
	require.NoError(t, err)
	require.NoError(t, res.Result.AsError())
	assert.Equal(t, 2, m.Service().Stats().HeldSegments)
}

// An SSD tier mounted again (MountDisk with again) that the master does
// not know takes no spill or offload for the hold; its objects are taken
// at once. A tier's first mount is not held.
func TestRemountHoldSSDTier(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	first, again := seg("1", 1<<20, 1<<20), seg("2", 4<<20, 1<<20)
	first.Medium, again.Medium = storepb.Medium_MEDIUM_DISK, storepb.Medium_MEDIUM_DISK
	_, err := s.MountDisk(ctx, "a", first, nil, false)
	require.NoError(t, err)
	taken, err := s.MountDisk(ctx, "b", again, []*storepb.DiskObject{{Key: "k", Offset: 0, Size: 100, Checksum: 1}}, true)
	require.NoError(t, err)
	assert.Equal(t, []bool{true}, taken)

	alloc := func() (string, bool) {
		s.segMu.Lock()
		defer s.segMu.Unlock()
		r, ok := s.allocOnLocked(storepb.Medium_MEDIUM_DISK, "b", 4096) // b's own tier first
		if !ok {
			return "", false
		}
		return r.seg.id, true
	}
	id, ok := alloc()
	require.True(t, ok)
	assert.Equal(t, "1", id, "a copy went to the held tier")
	clock.Advance(DefaultRemountHold)
	id, ok = alloc()
	require.True(t, ok)
	assert.Equal(t, "2", id)
}

// A hold is a wall-clock time once it is in the journal: a clock stepped
// back, or a new leader whose clock is behind, holds a segment no longer
// than RemountHold from when it looks; a master with the hold turned off
// keeps none it restores.
func TestRemountHoldBoundedByClock(t *testing.T) {
	s, clock := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	ctx := t.Context()
	require.NoError(t, s.ReMountSegment(ctx, "b", []*storepb.Segment{seg("2", 4<<20, 1<<20)}, true))
	clock.Advance(-time.Hour) // the clock stepped back
	_, err := s.PutStart(ctx, "c", "k", 4096, nil)
	require.ErrorIs(t, err, storepb.ErrNoAvailableHandle)
	clock.Advance(DefaultRemountHold)
	put(t, s, "c", "k", 4096, nil)

	st := newState()
	for _, r := range j.recs {
		require.NoError(t, st.apply(r))
	}
	behind, clock2 := newTestService(t, ServiceConfig{})
	clock2.Advance(-time.Hour) // a leader an hour behind the one that wrote it
	require.NoError(t, behind.restore(st))
	assert.Equal(t, 1, behind.Stats().HeldSegments)
	clock2.Advance(DefaultRemountHold)
	assert.Zero(t, behind.Stats().HeldSegments, "held longer than RemountHold")

	off, _ := newTestService(t, ServiceConfig{RemountHold: -1})
	require.NoError(t, off.restore(st))
	assert.Zero(t, off.Stats().HeldSegments, "a hold restored with the hold turned off")
}

// A put's failure names held segments only where they could take it: a
// held SSD tier takes no puts, and a value larger than any held segment
// would not fit once the hold ends either.
func TestRemountHoldMessage(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	tier := seg("3", 16<<20, 8<<20)
	tier.Medium = storepb.Medium_MEDIUM_DISK
	_, err := s.MountDisk(ctx, "b", tier, nil, true)
	require.NoError(t, err)
	require.Equal(t, 1, s.Stats().HeldSegments)
	_, err = s.PutStart(ctx, "c", "big", 2<<20, nil)
	require.ErrorIs(t, err, storepb.ErrNoAvailableHandle)
	assert.NotContains(t, err.Error(), "held")

	require.NoError(t, s.ReMountSegment(ctx, "d", []*storepb.Segment{seg("2", 4<<20, 1<<20)}, true))
	_, err = s.PutStart(ctx, "c", "big", 2<<20, nil)
	require.ErrorIs(t, err, storepb.ErrNoAvailableHandle)
	assert.NotContains(t, err.Error(), "held", "a 1 MiB segment held cannot take 2 MiB")
}

// A hold that starts is logged, naming the segment and how long it lasts;
// a first mount logs nothing.
func TestRemountHoldLogged(t *testing.T) {
	buf := logtest.Capture(t)
	s, _ := newTestService(t, ServiceConfig{})
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<20, 1<<20)))
	assert.NotContains(t, buf.String(), "held from new replicas")
	require.NoError(t, s.ReMountSegment(ctx, "b", []*storepb.Segment{seg("2", 4<<20, 1<<20)}, true))
	assert.Contains(t, buf.String(), `msg="master: segment mounted again, held from new replicas" segment=2 name=node-2 client=b for=10s`)
}
