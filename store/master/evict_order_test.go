package master

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// checkEvictOrder checks that every shard's eviction order holds exactly
// the objects an eviction may take, each in the heap of its class at its
// current lease, soft-pinned ones also in pins at the end of their pins,
// and that the heaps are heaps.
func checkEvictOrder(t *testing.T, s *Service) {
	t.Helper()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		var want [numClasses]int
		pinned := 0
		for key, o := range sh.objects {
			c := classOf(o, s.now)
			n := &o.ev
			if c != classNone && n.class-1 == (c-1)|classSoft && !o.softPinUntil.After(s.now()) {
				c = n.class // its pin ended; the next eviction moves it
			}
			require.Equal(t, c, n.class, "%q: class", key)
			if c == classNone {
				require.False(t, n.pinned, "%q: in pins, in no class", key)
				continue
			}
			want[c-1]++
			h := &sh.order.byLease[c-1]
			require.Less(t, int(n.idx), len(h.a), "%q: index", key)
			require.Same(t, o, h.a[n.idx].o, "%q: not where its index says", key)
			require.Equal(t, n.lease, h.a[n.idx].key, "%q: heap key", key)
			require.Equal(t, stamp(o.lease), n.lease, "%q: heap key is not its lease", key)
			require.Equal(t, key, n.key, "%q: key", key)
			soft := (c-1)&classSoft != 0
			require.Equal(t, soft, n.pinned, "%q: in pins", key)
			if soft {
				pinned++
				require.Same(t, o, sh.order.pins.a[n.pinIdx].o, "%q: not where its pin index says", key)
				require.Equal(t, n.pinEnd, sh.order.pins.a[n.pinIdx].key, "%q: pins key", key)
				require.Equal(t, stamp(o.softPinUntil), n.pinEnd, "%q: pins key", key)
			}
		}
		for c := range numClasses {
			h := &sh.order.byLease[c]
			require.Len(t, h.a, want[c], "shard %d class %d: objects not in the map", i, c+1)
			checkHeap(t, h)
		}
		require.Len(t, sh.order.pins.a, pinned, "shard %d: pins", i)
		checkHeap(t, &sh.order.pins)
		sh.mu.Unlock()
	}
}

func checkHeap(t *testing.T, h *objHeap) {
	t.Helper()
	for i := 1; i < len(h.a); i++ {
		require.LessOrEqual(t, h.a[(i-1)/heapArity].key, h.a[i].key, "heap property at %d", i)
	}
}

// scanOrder is what a forced eviction takes, by a scan of the pool: the
// evictable objects by lease, those with a soft pin running after the rest.
func scanOrder(s *Service) []string {
	now := s.now()
	type cand struct {
		key   string
		soft  bool
		lease int64
	}
	var cands []cand
	for i := range s.shards {
		for key, o := range s.shards[i].objects {
			if evictable(o, now, true) {
				cands = append(cands, cand{key, o.softPinUntil.After(now), stamp(o.lease)})
			}
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		return cmp.Or(cmp.Compare(b2i(a.soft), b2i(b.soft)), cmp.Compare(a.lease, b.lease))
	})
	keys := make([]string, len(cands))
	for i, c := range cands {
		keys[i] = c.key
	}
	return keys
}

// Under a random mix of puts, upserts (ended, revoked, in flight), reads,
// removals, pins and evictions, the order always holds exactly the objects
// eviction may take, and each eviction takes exactly the objects a scan of
// the pool would give, in its order.
func TestEvictOrderMatchesScan(t *testing.T) {
	// Reads' leases end off the microseconds the clock moves by: no lease
	// ties, whose order a scan does not define.
	s, clk := newTestService(t, ServiceConfig{Shards: 4, LeaseTTL: 50*time.Millisecond + time.Nanosecond})
	const size, slots = 1024, 400
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, slots*size)))
	r := rand.New(rand.NewPCG(11, 12))
	upserting := map[string]bool{}
	evictions := 0
	for step := range 6000 {
		clk.Advance(time.Duration(1+r.IntN(3000)) * time.Microsecond)
		key := fmt.Sprint("k", r.IntN(600))
		switch op := r.IntN(100); {
		case op < 35:
			var rc *storepb.ReplicateConfig
			switch r.IntN(10) {
			case 0:
				rc = &storepb.ReplicateConfig{WithHardPin: true}
			case 1, 2:
				rc = &storepb.ReplicateConfig{WithSoftPin: true, SoftPinTtlMs: int64(1 + r.IntN(100))}
			}
			if _, err := s.PutStart(t.Context(), "c1", key, size, rc); err == nil {
				require.NoError(t, s.PutEnd(t.Context(), "c1", key, 1))
			}
		case op < 50:
			if upserting[key] {
				if r.IntN(2) == 0 {
					require.NoError(t, s.UpsertEnd(t.Context(), "c1", key, 2))
				} else {
					require.NoError(t, s.UpsertRevoke(t.Context(), "c1", key))
				}
				delete(upserting, key)
			} else if _, err := s.UpsertStart(t.Context(), "c1", key, size, nil); err == nil {
				upserting[key] = true
			}
		case op < 80:
			_, _, _, _, _ = s.GetReplicaList(key)
		case op < 85:
			_, _ = s.ExistKey(key)
		case op < 92:
			_ = s.Remove(t.Context(), key, r.IntN(2) == 0)
		default:
			want := scanOrder(s)
			s.needEvict.Store(true)
			freed := s.Evict()
			evictions++
			n := int(freed / size)
			require.LessOrEqual(t, n, len(want), "step %d", step)
			for i, key := range want {
				_, ok := s.shardOf(key).objects[key]
				require.Equal(t, i >= n, ok, "step %d: rank %d of %d (%s), %d evicted", step, i, len(want), key, n)
			}
		}
		checkEvictOrder(t, s)
	}
	require.Greater(t, evictions, 100)
	require.Positive(t, s.Stats().EvictedKeys)
}

// An eviction looks at the objects it takes and at most one more per
// heap: not at the hard-pinned objects, the puts in flight or the
// soft-pinned objects older than them, nor at leased ones behind a leased
// head. A pool scan, or an order that kept those objects and skipped them,
// looks at thousands.
func TestEvictionVisitsOnlyWhatItTakes(t *testing.T) {
	const shards, quarter, size = 8, 1000, 1024
	s, clk := newTestService(t, ServiceConfig{Shards: shards})
	// Room for the upserts' new values too.
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, 5*quarter*size)))
	hard := &storepb.ReplicateConfig{WithHardPin: true}
	soft := &storepb.ReplicateConfig{WithSoftPin: true, SoftPinTtlMs: 3_600_000}
	// Oldest first: hard-pinned, then upserts in flight, soft-pinned, plain.
	for i := range 4 * quarter {
		clk.Advance(time.Microsecond)
		switch i / quarter {
		case 0:
			put(t, s, "c1", fmt.Sprint("k", i), size, hard)
		case 2:
			put(t, s, "c1", fmt.Sprint("k", i), size, soft)
		default:
			put(t, s, "c1", fmt.Sprint("k", i), size, nil)
		}
	}
	for i := quarter; i < 2*quarter; i++ {
		_, err := s.UpsertStart(t.Context(), "c1", fmt.Sprint("k", i), size, nil)
		require.NoError(t, err)
	}
	clk.Advance(2 * DefaultLeaseTTL)
	checkEvictOrder(t, s)

	visits := func(evict func() uint64) (visited, taken uint64) {
		v, k := s.evictVisited, s.Stats().EvictedKeys
		evict()
		return s.evictVisited - v, s.Stats().EvictedKeys - k
	}
	// The pool is full: 15%, 750 plain objects.
	v, k := visits(s.Evict)
	require.Equal(t, uint64(750), k)
	assert.LessOrEqual(t, v, k+numClasses*shards, "an eviction of %d objects looked at %d", k, v)
	// Every plain object left is read (leased): a forced eviction finds
	// leased heads, and takes soft-pinned objects in its second pass.
	for i := 3 * quarter; i < 4*quarter; i++ {
		_, _, _, _, _ = s.GetReplicaList(fmt.Sprint("k", i))
	}
	s.needEvict.Store(true)
	v, k = visits(s.Evict)
	require.Equal(t, uint64(quarter/4), k, "5% of the pool, from the soft-pinned")
	assert.LessOrEqual(t, v, k+numClasses*shards, "an eviction of %d objects looked at %d", k, v)
	checkEvictOrder(t, s)
}

// A read moves an object behind the objects leased before it; an upsert
// in flight takes it out of the order, its end puts it at the back, its
// revoke back where its lease puts it; a removal takes it out.
func TestEvictOrderFollowsLeasesAndUpserts(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{Shards: 2, LeaseTTL: 10 * time.Millisecond})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, 20*1024)))
	for i := range 8 {
		clk.Advance(time.Millisecond)
		put(t, s, "c1", fmt.Sprint("k", i), 1024, nil)
	}
	_, _, _, _, err := s.GetReplicaList("k0") // k0 last: leased until now+10ms
	require.NoError(t, err)
	_, err = s.UpsertStart(t.Context(), "c1", "k1", 1024, nil) // k1 out
	require.NoError(t, err)
	_, err = s.UpsertStart(t.Context(), "c1", "k2", 1024, nil)
	require.NoError(t, err)
	require.NoError(t, s.UpsertRevoke(t.Context(), "c1", "k2")) // k2 back, oldest
	clk.Advance(time.Millisecond)
	_, err = s.UpsertStart(t.Context(), "c1", "k3", 1024, nil)
	require.NoError(t, err)
	require.NoError(t, s.UpsertEnd(t.Context(), "c1", "k3", 5)) // k3 new: before k0's lease ends
	require.NoError(t, s.Remove(t.Context(), "k4", false))
	checkEvictOrder(t, s)
	assert.Equal(t, []string{"k2", "k5", "k6", "k7", "k3"}, scanOrder(s), "k0 leased, k1 upserting, k4 gone")
	clk.Advance(20 * time.Millisecond)
	assert.Equal(t, []string{"k2", "k5", "k6", "k7", "k3", "k0"}, scanOrder(s))
	// Evictions take that order, one object at a time (5% of 20 KiB).
	for _, key := range []string{"k2", "k5", "k6", "k7", "k3", "k0"} {
		s.needEvict.Store(true)
		require.Equal(t, uint64(1024), s.Evict(), "evicting %s", key)
		_, ok := s.shardOf(key).objects[key]
		require.False(t, ok, "%s not evicted in its turn", key)
		checkEvictOrder(t, s)
	}
}

// A new leader's restore (journal replay, or a snapshot and its tail)
// rebuilds the eviction order: the restored objects are taken once their
// restore leases end, hard-pinned ones and puts in flight never.
func TestEvictOrderRebuiltByRestore(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{Shards: 4})
	j := &memJournal{}
	s.j = j
	const n, size = 100, 1024
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, n*size)))
	for i := range n - 10 {
		clk.Advance(time.Microsecond)
		var rc *storepb.ReplicateConfig
		if i < 10 {
			rc = &storepb.ReplicateConfig{WithHardPin: true}
		}
		put(t, s, "c1", fmt.Sprint("k", i), size, rc)
	}
	_, err := s.PutStart(t.Context(), "c1", "inflight", size, nil)
	require.NoError(t, err)
	_, err = s.UpsertStart(t.Context(), "c1", "k50", size, nil)
	require.NoError(t, err)

	st := newState()
	for i, r := range j.recs {
		require.NoError(t, st.apply(r), "record %d", i+1)
	}
	s2, clk2 := newTestService(t, ServiceConfig{Shards: 4})
	require.NoError(t, s2.MountSegment(t.Context(), "c9", seg("9", 1<<30, 4096)))
	put(t, s2, "c9", "stale", 1, nil) // replaced by the restore
	require.NoError(t, s2.restore(st))
	checkEvictOrder(t, s2)
	clk2.Advance(2 * DefaultLeaseTTL)
	for range 20 {
		s2.needEvict.Store(true)
		s2.Evict()
	}
	checkEvictOrder(t, s2)
	var left []string
	for i := range s2.shards {
		for key := range s2.shards[i].objects {
			left = append(left, key)
		}
	}
	slices.Sort(left)
	want := []string{"inflight", "k50"}
	for i := range 10 {
		want = append(want, fmt.Sprint("k", i))
	}
	slices.Sort(want)
	assert.Equal(t, want, left, "everything else evicted")
}

// Objects with a move in flight (here the offloads every put queues when
// an SSD tier has room) are taken only by a forced eviction; a move that
// ends puts them back in the plain order, and evicting one with an SSD copy
// takes it out (only SSD is left).
func TestEvictOrderMoves(t *testing.T) {
	const n, size = 100, 1024
	s, clk := newTestService(t, ServiceConfig{Shards: 4})
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, n*size)))
	disk := seg("2", 1<<30, 2*n*size)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, s.MountSegment(t.Context(), "c1", disk))
	for i := range n {
		clk.Advance(time.Microsecond)
		put(t, s, "c1", fmt.Sprint("k", i), size, nil)
	}
	clk.Advance(2 * DefaultLeaseTTL)
	checkEvictOrder(t, s)
	// Every object is moving: the full pool's unforced eviction takes none.
	require.Zero(t, s.Evict())
	// The first 20 offloads end: those are plain again, and an unforced
	// eviction (15%) takes them (DRAM only: their SSD copies stay) before
	// any moving object.
	tasks := s.takeTasks(t.Context(), "c1")
	require.Len(t, tasks, n)
	slices.SortFunc(tasks, func(a, b *storepb.MoveTask) int { return cmp.Compare(a.Id, b.Id) })
	for _, task := range tasks[:20] {
		require.NoError(t, s.MoveEnd(t.Context(), "c1", task.Id, true))
	}
	checkEvictOrder(t, s)
	require.Equal(t, uint64(15*size), s.Evict())
	checkEvictOrder(t, s)
	for i := range n {
		o := s.shardOf(fmt.Sprint("k", i)).objects[fmt.Sprint("k", i)]
		require.NotNil(t, o, "k%d", i)
		require.Equal(t, i < 15, o.replicas[0].onDisk(), "k%d: only on SSD", i)
	}
	// Forced evictions (5% each) take the oldest, moving or not: the last
	// five offloaded, then five moving (dropped: no SSD copy yet).
	for range 2 {
		s.needEvict.Store(true)
		require.Equal(t, uint64(5*size), s.Evict())
		checkEvictOrder(t, s)
	}
	for i := range 25 {
		o := s.shardOf(fmt.Sprint("k", i)).objects[fmt.Sprint("k", i)]
		if i < 20 {
			require.True(t, o.replicas[0].onDisk(), "k%d: only on SSD", i)
		} else {
			require.Nil(t, o, "k%d: moving, not taken", i)
		}
	}
}
