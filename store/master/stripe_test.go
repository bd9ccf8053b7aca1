package master

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// mountN mounts n segments of size bytes, one per client and host (c1 on
// host-1 holds node-1, and so on).
func mountN(t *testing.T, s *Service, n int, size uint64) {
	t.Helper()
	for i := 1; i <= n; i++ {
		id := string(rune('0' + i))
		require.NoError(t, s.MountSegment(t.Context(), "c"+id, seg(id, uint64(i)<<32, size)))
	}
}

// stripesOf checks that m is striped as the protocol says (the top-level
// fields name the first piece, the size is the whole) and returns the
// pieces' segments.
func stripesOf(t *testing.T, m *storepb.MemoryReplica, length uint64) []string {
	t.Helper()
	require.Equal(t, length, m.Size, "a striped replica's size is the whole value's")
	if len(m.Stripes) == 0 {
		return []string{m.SegmentName}
	}
	var names []string
	var sum uint64
	for i, p := range m.Stripes {
		assert.Empty(t, p.Stripes, "a piece has no stripes of its own")
		assert.NotZero(t, p.Size)
		if i < len(m.Stripes)-1 {
			assert.Zero(t, p.Size%pieceAlign, "every piece but the last is page-aligned in length")
		}
		names = append(names, p.SegmentName)
		sum += p.Size
	}
	assert.Equal(t, length, sum, "the pieces make up the value")
	assert.Equal(t, m.Stripes[0].SegmentName, m.SegmentName)
	assert.Equal(t, m.Stripes[0].BufferAddress, m.BufferAddress)
	return names
}

func TestStripedPlacement(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	mountN(t, s, 6, 64<<20)
	const n = 10<<20 + 12345
	reps := put(t, s, "c1", "k", n, &storepb.ReplicateConfig{StripeCount: 4})
	require.Len(t, reps, 1)
	names := stripesOf(t, mem(reps[0]), n)
	require.Len(t, names, 4)
	assert.ElementsMatch(t, names, unique(names), "pieces on distinct segments")
	got, _, _, length, err := s.GetReplicaList("k")
	require.NoError(t, err)
	require.Equal(t, uint64(n), length)
	assert.Equal(t, names, stripesOf(t, mem(got[0]), n), "the reader sees the pieces in order")
	checkNoOverlap(t, s)
	assert.Equal(t, uint64(n), s.Stats().ValueBytes)

	// Removing the object frees every piece.
	require.NoError(t, s.Remove(t.Context(), "k", true))
	for _, sg := range s.segList {
		assert.Zero(t, sg.alloc.Used(), "segment %s", sg.id)
	}
}

func unique(xs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

func TestStripePolicy(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{StripeMinSize: 2 << 20, StripeCount: 3})
	mountN(t, s, 5, 64<<20)
	pieces := func(key string, n uint64, cfg *storepb.ReplicateConfig) int {
		reps := put(t, s, "c1", key, n, cfg)
		require.Len(t, reps, 1)
		return len(stripesOf(t, mem(reps[0]), n))
	}
	assert.Equal(t, 3, pieces("big", 2<<20, nil), "the master's policy from StripeMinSize")
	assert.Equal(t, 1, pieces("small", 2<<20-1, nil), "below StripeMinSize")
	assert.Equal(t, 1, pieces("one", 4<<20, &storepb.ReplicateConfig{StripeCount: 1}), "a put that asks for one piece")
	assert.Equal(t, 5, pieces("five", 4<<20, &storepb.ReplicateConfig{StripeCount: 5}), "a put that asks for more")
	assert.Equal(t, 2, pieces("tiny", 2*minPiece+1, &storepb.ReplicateConfig{StripeCount: 4}), "pieces of at least minPiece")
	assert.Equal(t, 1, pieces("tinier", minPiece, &storepb.ReplicateConfig{StripeCount: 4}))
	assert.Equal(t, 5, pieces("fewer", 8<<20, &storepb.ReplicateConfig{StripeCount: 9}), "no more pieces than segments")

	for _, bad := range []int32{-1, MaxStripes + 1} {
		_, err := s.PutStart(t.Context(), "c1", "bad", 4<<20, &storepb.ReplicateConfig{StripeCount: bad})
		require.ErrorIs(t, err, storepb.ErrInvalidParams, "stripe_count %d", bad)
	}
	require.ErrorContains(t, ServiceConfig{StripeCount: -1}.Validate(), "StripeCount")
	require.ErrorContains(t, ServiceConfig{StripeCount: MaxStripes + 1}.Validate(), "StripeCount")
	checkNoOverlap(t, s)
}

// Pieces go to distinct hosts while there are enough: striping spreads a
// value over links, and two pieces behind one link gain nothing. Replicas
// of one value share no segment.
func TestStripesSpreadOverHosts(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		s, _ := newTestService(t, ServiceConfig{Seed: seed})
		// Two hosts with three segments each.
		for i := 1; i <= 6; i++ {
			id := string(rune('0' + i))
			sg := seg(id, uint64(i)<<32, 64<<20)
			sg.HostId = "host-" + string(rune('a'+(i-1)/3)) // node-1..3 on host-a
			require.NoError(t, s.MountSegment(t.Context(), "c"+id, sg))
		}
		reps := put(t, s, "c1", "k", 8<<20, &storepb.ReplicateConfig{StripeCount: 2, ReplicaNum: 3})
		require.Len(t, reps, 3)
		var all []string
		for _, r := range reps {
			names := stripesOf(t, mem(r), 8<<20)
			require.Len(t, names, 2)
			hosts := map[string]bool{}
			for _, name := range names {
				hosts[s.segByName(name).hostID] = true
			}
			assert.Len(t, hosts, 2, "seed %d: a replica's two pieces on the two hosts", seed)
			all = append(all, names...)
		}
		assert.Len(t, unique(all), 6, "seed %d: no segment holds two pieces of the value", seed)
		checkNoOverlap(t, s)
	}
}

// segByName is the mounted segment named name (tests mount one per name).
func (s *Service) segByName(name string) *segment {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	for _, sg := range s.segList {
		if sg.name == name {
			return sg
		}
	}
	return nil
}

// With room for fewer pieces than asked, a put takes fewer, down to one
// allocation; without room for any, it fails as an unstriped put does.
func TestStripesBestEffort(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	mountN(t, s, 3, 4<<20)
	// 6 MiB cannot lie in one 4 MiB segment, nor in two 3 MiB pieces
	// beside a 2 MiB object on each of two segments; it takes three.
	put(t, s, "c1", "a", 2<<20, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
	put(t, s, "c1", "b", 2<<20, &storepb.ReplicateConfig{PreferredSegments: []string{"node-2"}})
	reps := put(t, s, "c1", "k", 6<<20, &storepb.ReplicateConfig{StripeCount: 4})
	assert.Len(t, stripesOf(t, mem(reps[0]), 6<<20), 3)
	checkNoOverlap(t, s)

	_, err := s.PutStart(t.Context(), "c1", "huge", 13<<20, &storepb.ReplicateConfig{StripeCount: 4})
	require.ErrorIs(t, err, storepb.ErrNoAvailableHandle)
	checkNoOverlap(t, s)
}

// A value larger than any segment fits in pieces, evicting for them as an
// unstriped put evicts for its replica (into fewer pieces once those fit),
// and evicting a striped value frees every piece.
func TestStripedPutEvicts(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	mountN(t, s, 4, 4<<20)
	for i := range 4 {
		put(t, s, "c1", "old"+string(rune('0'+i)), 3<<20, &storepb.ReplicateConfig{PreferredSegments: []string{"node-" + string(rune('1'+i))}})
	}
	clk.Advance(time.Minute) // their leases end
	reps := put(t, s, "c1", "k", 12<<20, &storepb.ReplicateConfig{StripeCount: 4})
	assert.GreaterOrEqual(t, len(stripesOf(t, mem(reps[0]), 12<<20)), 3)
	checkNoOverlap(t, s)

	clk.Advance(time.Minute)
	for range 20 {
		if _, _, _, _, err := s.GetReplicaList("k"); err != nil {
			break
		}
		clk.Advance(time.Minute)
		s.evict(true)
	}
	_, _, _, _, err := s.GetReplicaList("k")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound)
	checkNoOverlap(t, s)
}

// A striped replica that loses a piece (its segment unmounted) is lost;
// its other pieces are freed once the reader's lease ends, and those of a
// put in flight once its writer is presumed gone. A replica elsewhere
// still serves.
func TestStripedReplicaLosesPiece(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	mountN(t, s, 5, 64<<20)
	reps := put(t, s, "c1", "k", 8<<20, &storepb.ReplicateConfig{StripeCount: 4, PreferredSegments: []string{"node-1"}})
	require.Equal(t, "node-1", mem(reps[0]).SegmentName)
	_, _, _, _, err := s.GetReplicaList("k") // a reader's lease
	require.NoError(t, err)
	_, err = s.PutStart(t.Context(), "c2", "pending", 8<<20, &storepb.ReplicateConfig{StripeCount: 4, PreferredSegments: []string{"node-1"}})
	require.NoError(t, err)
	both := put(t, s, "c1", "two", 4<<20, &storepb.ReplicateConfig{StripeCount: 2, ReplicaNum: 2, PreferredSegments: []string{"node-1"}})
	require.Len(t, both, 2)

	require.NoError(t, s.UnmountSegment(t.Context(), "c1", "1"))
	_, _, _, _, err = s.GetReplicaList("k")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound, "a replica without one of its pieces is lost")
	require.ErrorIs(t, s.PutEnd(t.Context(), "c2", "pending", 7), storepb.ErrObjectNotFound)
	got, _, _, _, err := s.GetReplicaList("two")
	require.NoError(t, err)
	require.Len(t, got, 1, "the other replica serves")
	assert.NotContains(t, stripesOf(t, mem(got[0]), 4<<20), "node-1")
	checkNoOverlap(t, s)

	used := func() uint64 { return poolUsed(s) }
	live := uint64(4 << 20) // "two"'s surviving replica
	require.Greater(t, used(), live, "the lost pieces wait for the reader and the writer")
	clk.Advance(s.cfg.LeaseTTL + time.Second)
	s.evict(false)
	require.Greater(t, used(), live, "the put's pieces wait for its writer")
	clk.Advance(s.cfg.PutStartDiscardTimeout)
	s.evict(false)
	assert.Equal(t, live, used(), "every lost piece freed")
	checkNoOverlap(t, s)
}

// A drain moves a striped replica's piece off the drained segment; the
// replica keeps its other pieces and its order, and a replay of the
// journal (a new leader) agrees.
func TestDrainMovesAPiece(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	j := &memJournal{}
	s.j = j
	ctx := t.Context()
	mountN(t, s, 5, 64<<20)
	reps := put(t, s, "c1", "k", 8<<20, &storepb.ReplicateConfig{StripeCount: 4})
	before := stripesOf(t, mem(reps[0]), 8<<20)
	require.Len(t, before, 4)
	drained := before[1]
	_, err := s.startDrain(t.Context(), []string{drained}, nil, 0)
	require.NoError(t, err)
	owner := "c" + drained[len("node-"):]
	tasks := s.takeTasks(t.Context(), owner)
	require.Len(t, tasks, 1, "the drain's move of the piece")
	assert.Empty(t, tasks[0].Source.Stripes, "a move is of one piece")
	assert.Equal(t, uint64(2<<20), tasks[0].Source.Size)
	require.NoError(t, s.MoveEnd(ctx, owner, tasks[0].Id, true))

	got, _, _, _, err := s.GetReplicaList("k")
	require.NoError(t, err)
	require.Len(t, got, 1)
	after := stripesOf(t, mem(got[0]), 8<<20)
	require.Len(t, after, 4)
	assert.Equal(t, before[0], after[0])
	assert.Equal(t, tasks[0].Target.SegmentName, after[1], "the piece's new place, in its place")
	assert.Equal(t, before[2:], after[2:])
	assert.NotContains(t, after, drained)
	want := view(s)
	checkNoOverlap(t, s)

	st := newState()
	for _, r := range j.recs {
		require.NoError(t, st.apply(r))
	}
	s2, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s2.restore(st))
	assert.Equal(t, want, view(s2))
	checkNoOverlap(t, s2)
}

// Striped values are not spilled to an SSD tier (pieces are DRAM only):
// eviction drops them, and a new one is not offloaded either.
func TestStripedNotSpilled(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	mountN(t, s, 3, 4<<20)
	disk := seg("9", 9<<32, 64<<20)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, s.MountSegment(t.Context(), "c1", disk))
	put(t, s, "c1", "k", 12<<20, &storepb.ReplicateConfig{StripeCount: 3})
	tasks := func() (n int) {
		for _, c := range []string{"c1", "c2", "c3"} {
			n += len(s.takeTasks(t.Context(), c))
		}
		return n
	}
	assert.Zero(t, tasks(), "no offload of a striped value")
	clk.Advance(time.Minute)
	s.evict(false) // above the watermark: an eviction that spills what it can
	assert.Zero(t, tasks(), "no spill of a striped value")
	_, _, _, _, err := s.GetReplicaList("k")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound, "evicted, not spilled")
	checkNoOverlap(t, s)
}

// A journal replay and a snapshot of striped values rebuild them exactly,
// their pieces' space included; an unmount replayed drops a replica that
// lost a piece and frees the rest.
func TestStripedJournalReplay(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{StripeMinSize: 1 << 20})
	j := &memJournal{}
	s.j = j
	mountN(t, s, 6, 64<<20)
	put(t, s, "c1", "a", 8<<20, nil)
	put(t, s, "c1", "b", 3<<20+5, &storepb.ReplicateConfig{StripeCount: 3, ReplicaNum: 2})
	put(t, s, "c1", "c", 100, nil)
	_, err := s.PutStart(t.Context(), "c1", "pending", 4<<20, nil)
	require.NoError(t, err)
	check := func() {
		t.Helper()
		st := newState()
		for _, r := range j.recs {
			require.NoError(t, st.apply(r))
		}
		s2, _ := newTestService(t, ServiceConfig{})
		require.NoError(t, s2.restore(st))
		assert.Equal(t, view(s), view(s2))
		checkNoOverlap(t, s2)

		snap, _ := s.snapshot(2)
		st3 := newState()
		for _, c := range snap {
			require.NoError(t, st3.loadChunk(c))
		}
		s3, _ := newTestService(t, ServiceConfig{})
		require.NoError(t, s3.restore(st3))
		assert.Equal(t, view(s), view(s3))
	}
	check()
	a, _, _, _, err := s.GetReplicaList("a")
	require.NoError(t, err)
	lost := mem(a[0]).Stripes[2].SegmentName
	require.NoError(t, s.UnmountSegment(t.Context(), "c"+lost[len("node-"):], lost[len("node-"):]))
	// The leader frees the lost pieces when the lease ends; the replay,
	// with no reader to wait for, at once: compare after the lease.
	s.cfg.Now = func() time.Time { return time.Now().Add(time.Hour) }
	s.evict(false)
	check()
}

// The admin API's query_key describes a striped replica as its pieces, in
// order, as Mooncake describes a replica cut into slices.
func TestQueryKeyDescribesPieces(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	mountN(t, s, 4, 64<<20)
	reps := put(t, s, "c1", "k", 5<<20+3, &storepb.ReplicateConfig{StripeCount: 3})
	descs, err := replicasOf(s, "k")
	require.NoError(t, err)
	m := mem(reps[0])
	require.Len(t, descs, len(m.Stripes))
	var sum uint64
	for i, d := range descs {
		assert.Equal(t, m.Stripes[i].BufferAddress, d.BufferAddress)
		assert.Equal(t, m.Stripes[i].TransportEndpoint, d.TransportEndpoint)
		sum += d.Size
	}
	assert.Equal(t, uint64(5<<20+3), sum)
}

// Every way a striped replica's space comes back frees all its pieces: a
// revoke, a zombie put pre-empted, an upsert's replaced value once its
// lease ends.
func TestStripedSpaceComesBack(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	mountN(t, s, 4, 64<<20)
	ctx := t.Context()
	cfg := &storepb.ReplicateConfig{StripeCount: 4}
	used := func() uint64 { return poolUsed(s) }
	_, err := s.PutStart(ctx, "c1", "revoked", 8<<20, cfg)
	require.NoError(t, err)
	require.NoError(t, s.PutRevoke(ctx, "c1", "revoked"))
	assert.Zero(t, used(), "a revoke frees every piece")

	_, err = s.PutStart(ctx, "c1", "zombie", 8<<20, cfg)
	require.NoError(t, err)
	clk.Advance(s.cfg.PutStartDiscardTimeout + time.Second)
	put(t, s, "c2", "zombie", 4<<20, cfg)
	assert.Equal(t, uint64(4<<20), used(), "a pre-empted put's pieces are freed")

	_, _, _, _, err = s.GetReplicaList("zombie") // a reader's lease on the old value
	require.NoError(t, err)
	_, err = s.UpsertStart(ctx, "c2", "zombie", 6<<20, cfg)
	require.NoError(t, err)
	require.NoError(t, s.UpsertEnd(ctx, "c2", "zombie", 9))
	assert.Equal(t, uint64(10<<20), used(), "the old value waits for its reader")
	clk.Advance(s.cfg.LeaseTTL + time.Second)
	s.evict(false)
	assert.Equal(t, uint64(6<<20), used(), "then every piece of it is freed")
	checkNoOverlap(t, s)
}

// Striping must not cost a put its replicas: with four segments, two
// replicas of a value asked to be cut into four pieces each get two
// pieces (fewer pieces is the best effort the protocol allows), not one
// replica of four pieces and none of the other.
func TestStripingKeepsReplicaCount(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	mountN(t, s, 4, 64<<20)
	reps := put(t, s, "c1", "k", 8<<20, &storepb.ReplicateConfig{StripeCount: 4, ReplicaNum: 2})
	require.Len(t, reps, 2, "both replicas placed")
	var all []string
	for _, r := range reps {
		all = append(all, stripesOf(t, mem(r), 8<<20)...)
	}
	assert.Len(t, unique(all), len(all), "no segment holds two pieces of the value")
	checkNoOverlap(t, s)

	// The master's policy likewise.
	s2, _ := newTestService(t, ServiceConfig{StripeMinSize: 1 << 20})
	mountN(t, s2, 3, 64<<20)
	reps = put(t, s2, "c1", "k", 8<<20, &storepb.ReplicateConfig{ReplicaNum: 2})
	require.Len(t, reps, 2, "both replicas placed under the policy")
	checkNoOverlap(t, s2)
}

// A drain's move of a piece whose source segment is unmounted meanwhile:
// the move ends after the unmount's record, before the sweep reaches the
// object (it is held up at a shard before). The leader and a replay of
// its journal must agree.
func TestDrainMoveRacingSourceUnmount(t *testing.T) {
	for _, stripes := range []int32{4, 1} {
		s, _ := newTestService(t, ServiceConfig{})
		j := &memJournal{}
		s.j = j
		ctx := t.Context()
		mountN(t, s, 6, 64<<20)
		key := "k"
		for i := 0; s.shardIndex(key) == 0; i++ {
			key = fmt.Sprintf("k%d", i)
		}
		reps := put(t, s, "c1", key, 8<<20, &storepb.ReplicateConfig{StripeCount: stripes})
		drained := stripesOf(t, mem(reps[0]), 8<<20)[0]
		id := drained[len("node-"):]
		_, err := s.startDrain(t.Context(), []string{drained}, nil, 0)
		require.NoError(t, err)
		tasks := s.takeTasks(t.Context(), "c"+id)
		require.Len(t, tasks, 1)

		s.shards[0].mu.Lock() // the sweep waits here
		unmounted := make(chan error)
		go func() { unmounted <- s.UnmountSegment(ctx, "c"+id, id) }()
		for recorded := false; !recorded; {
			j.mu.Lock()
			recorded = j.recs[len(j.recs)-1].GetUnmount() != nil
			j.mu.Unlock()
			runtime.Gosched()
		}
		_ = s.MoveEnd(ctx, "c"+id, tasks[0].Id, true)
		s.shards[0].mu.Unlock()
		require.NoError(t, <-unmounted)

		st := newState()
		for _, r := range j.recs {
			require.NoError(t, st.apply(r))
		}
		s2, _ := newTestService(t, ServiceConfig{})
		require.NoError(t, s2.restore(st))
		assert.Equal(t, view(s), view(s2), "stripes %d: the replay agrees with the leader", stripes)
		checkNoOverlap(t, s)
	}
}

// The pieces a sweep frees (a striped replica lost one, and no reader
// holds a lease) stay taken until the record of the expiry that lost
// them is durable: a new leader replaying a journal without it still has
// the replica, whose pieces must not hold a newer put's bytes by then.
func TestLostPiecesFreedOnceUnmountDurable(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{ClientTTL: time.Second})
	mountN(t, s, 4, 64<<20)
	put(t, s, "c1", "k", 8<<20, &storepb.ReplicateConfig{StripeCount: 4})
	used := func() uint64 { return poolUsed(s) }
	j := &lagJournal{}
	s.j = j
	clk.Advance(2 * time.Second)
	for _, c := range []string{"c2", "c3", "c4"} {
		s.Ping(c)
	}
	require.Equal(t, 1, s.ExpireClients(), "c1, holding one piece, expires")
	_, _, _, _, err := s.GetReplicaList("k")
	require.ErrorIs(t, err, storepb.ErrObjectNotFound, "the replica lost a piece")
	assert.Equal(t, uint64(6<<20), used(), "the other pieces wait for the expiry's record")
	require.NoError(t, j.wait(t.Context(), 0)) // the record is durable
	assert.Zero(t, used(), "then they are freed")
}

// A move of a value that an upsert then replaced (here an offload to the
// SSD tier, as for a drain's move of a piece) must not end as a replica
// of a newer value that took the old one's place: its bytes are the old
// value's. The replaced value's space is reused by the next upsert of the
// same size, so the move's source is found again, by place, in the newest
// value.
func TestMoveOfReplacedValueIsDropped(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 1<<32, 64<<20)))
	disk := seg("9", 9<<32, 64<<20)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, s.MountSegment(t.Context(), "c1", disk))
	v1 := put(t, s, "c1", "k", 1<<20, nil)
	tasks := s.takeTasks(t.Context(), "c1")
	require.Len(t, tasks, 1, "the offload of v1")
	for sum := uint32(8); sum <= 9; sum++ {
		_, err := s.UpsertStart(t.Context(), "c1", "k", 1<<20, nil)
		require.NoError(t, err)
		require.NoError(t, s.PutEnd(t.Context(), "c1", "k", sum))
	}
	got, _, _, _, err := s.GetReplicaList("k")
	require.NoError(t, err)
	require.Equal(t, mem(v1[0]).BufferAddress, mem(got[0]).BufferAddress, "v3 where v1 was")
	_ = s.MoveEnd(t.Context(), "c1", tasks[0].Id, true)
	got, _, _, _, err = s.GetReplicaList("k")
	require.NoError(t, err)
	for _, r := range got {
		assert.NotEqual(t, storepb.Medium_MEDIUM_DISK, mem(r).Medium, "v1's copy on the SSD tier serves v3")
	}
	checkNoOverlap(t, s)
}

// Values that would be striped get no reserved slots (a slot is one
// allocation), whether the put asks for pieces or the master's policy
// cuts them: the client then puts them the usual way.
func TestNoSlotsForStripedValues(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{StripeMinSize: 4 << 20})
	mountN(t, s, 4, 64<<20)
	ctx := t.Context()
	_, err := s.PutReserve(ctx, "", "c1", 4<<20, 2, nil)
	require.ErrorIs(t, err, storepb.ErrInvalidParams, "over StripeMinSize")
	_, err = s.PutReserve(ctx, "", "c1", 1<<20, 2, &storepb.ReplicateConfig{StripeCount: 4})
	require.ErrorIs(t, err, storepb.ErrInvalidParams, "asked for pieces")
	slots, err := s.PutReserve(ctx, "", "c1", 1<<20, 2, nil)
	require.NoError(t, err)
	require.Len(t, slots, 2)
	for _, sl := range slots {
		assert.Empty(t, mem(sl.Replicas[0]).Stripes)
	}
}

// seqJournal makes its records durable when the test says, in order, up
// to a sequence number; wait does not wait.
type seqJournal struct {
	mu      sync.Mutex
	n       uint64
	pending map[uint64]func()
}

var _ journal = (*seqJournal)(nil)

func (j *seqJournal) append(_ *storepb.JournalRecord, done func()) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.n++
	if done != nil {
		if j.pending == nil {
			j.pending = map[uint64]func(){}
		}
		j.pending[j.n] = done
	}
	return j.n
}

func (j *seqJournal) wait(context.Context, uint64) error { return nil }

func (j *seqJournal) last() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.n
}

// commit makes the records up to seq durable.
func (j *seqJournal) commit(seq uint64) {
	for i := uint64(1); i <= seq; i++ {
		j.mu.Lock()
		f := j.pending[i]
		delete(j.pending, i)
		j.mu.Unlock()
		if f != nil {
			f()
		}
	}
}

// A sweep may drop a striped replica that lost a piece to another
// unmount, one whose record came after the sweep's own: the replica's
// other pieces must wait for that record too, not only for the record of
// the unmount that swept them. Here unmount A (of an empty segment)
// sweeps the shard of k after unmount B (of a piece of k) was recorded,
// B's own sweep held back on shard 0.
func TestLostPiecesWaitForTheUnmountThatLostThem(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	shardIdx := func(key string) int {
		sh := s.shardOf(key)
		for i := range s.shards {
			if &s.shards[i] == sh {
				return i
			}
		}
		return -1
	}
	var k, k0 string
	for i := 0; k == "" || k0 == ""; i++ {
		key := fmt.Sprintf("key%d", i)
		switch {
		case shardIdx(key) == 0 && k0 == "":
			k0 = key
		case shardIdx(key) > 0 && k == "":
			k = key
		}
	}
	mountN(t, s, 3, 64<<20)
	put(t, s, "c1", k, 6<<20, &storepb.ReplicateConfig{StripeCount: 3})
	require.NoError(t, s.MountSegment(t.Context(), "c4", seg("4", 4<<32, 64<<20)))
	put(t, s, "c4", k0, 1<<20, &storepb.ReplicateConfig{PreferredSegments: []string{"node-4"}})
	used := func() uint64 { return poolUsed(s) }
	j := &seqJournal{}
	s.j = j

	x, first := s.shardOf(k), &s.shards[0]
	x.mu.Lock()
	aDone := make(chan error, 1)
	go func() { aDone <- s.UnmountSegment(context.Background(), "c4", "4") }() // record 1
	require.Eventually(t, func() bool {
		first.mu.Lock()
		if _, ok := first.objects[k0]; ok {
			first.mu.Unlock()
			return false
		}
		return true // shard 0 stays locked
	}, 10*time.Second, time.Millisecond, "A swept shard 0; it waits on k's shard")
	bDone := make(chan error, 1)
	go func() { bDone <- s.UnmountSegment(context.Background(), "c1", "1") }() // record 2
	require.Eventually(t, func() bool { return j.last() == 2 }, 10*time.Second, time.Millisecond, "B recorded; its sweep waits on shard 0")
	x.mu.Unlock()
	require.NoError(t, <-aDone) // A dropped k, which lost its piece on segment 1
	j.commit(1)
	assert.Equal(t, uint64(4<<20), used(), "k's pieces on segments 2 and 3 wait for B's record")
	first.mu.Unlock()
	require.NoError(t, <-bDone)
	j.commit(2)
	assert.Zero(t, used(), "then they are freed")
}

// poolUsed is the bytes allocated in s's segments.
func poolUsed(s *Service) (n uint64) {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	for _, sg := range s.segList {
		n += sg.alloc.Used()
	}
	return n
}
