package master

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// selectSmallest leaves the k smallest leases in front, whatever the mix
// of distinct and equal leases.
func TestSelectSmallest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 500 {
		n := r.IntN(3000)
		spread := []int64{1, 3, 100, 1 << 40}[trial%4] // 1: all equal
		c := make([]candidate, n)
		for i := range c {
			c[i] = candidate{lease: r.Int64N(spread), key: strconv.Itoa(i)}
		}
		want := slices.Clone(c)
		slices.SortFunc(want, byLease)
		k := 0
		if n > 0 {
			k = r.IntN(n + 1)
		}
		selectSmallest(c, k)
		// A permutation of the input...
		ids := make([]int, n)
		for i, x := range c {
			ids[i], _ = strconv.Atoi(x.key)
		}
		slices.Sort(ids)
		for i, id := range ids {
			require.Equal(t, i, id, "trial %d: not a permutation", trial)
		}
		// ...whose front holds the k smallest.
		if k > 0 && k < n {
			front := slices.MaxFunc(c[:k], byLease).lease
			back := slices.MinFunc(c[k:], byLease).lease
			require.LessOrEqual(t, front, back, "trial %d: n=%d k=%d", trial, n, k)
		}
		front := slices.Clone(c[:k])
		slices.SortFunc(front, byLease)
		for i := range front {
			require.Equal(t, want[i].lease, front[i].lease, "trial %d", trial)
		}
	}
}

// In a pool of many objects put in shuffled order, eviction takes exactly
// the least recently leased ones, across shards.
func TestEvictionOrderAtScale(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	const n, size = 20000, 1024
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, n*size)))
	for i := range n {
		clk.Advance(time.Microsecond)
		put(t, s, "c1", fmt.Sprint("k", i), size, nil)
	}
	// Lease a shuffled half again: those become the newest, in that order.
	order := rand.New(rand.NewPCG(3, 4)).Perm(n)
	clk.Advance(2 * DefaultLeaseTTL) // every put's lease is over
	for _, i := range order[:n/2] {
		clk.Advance(time.Microsecond)
		_, _, _, _, err := s.GetReplicaList(fmt.Sprint("k", i))
		require.NoError(t, err)
	}
	clk.Advance(2 * DefaultLeaseTTL)
	// LRU order: the unleased half by put time, then the leased half in
	// the order of their reads.
	unread := slices.Clone(order[n/2:])
	slices.Sort(unread)
	lru := append(unread, order[:n/2]...)

	// Full pool: eviction frees 15% (used - 0.90 + 0.05), 3000 objects,
	// the least recently leased.
	freed := s.Evict()
	require.Equal(t, uint64(3*n*size/20), freed)
	gone := int(freed / size)
	for rank, i := range lru {
		_, ok := s.shardOf(fmt.Sprint("k", i)).objects[fmt.Sprint("k", i)]
		require.Equal(t, rank >= gone, ok, "rank %d (k%d)", rank, i)
	}
	// Below the watermark only a forced eviction runs: 5% more, the next
	// oldest.
	assert.Zero(t, s.Evict())
	s.needEvict.Store(true)
	require.Equal(t, uint64(n*size/20), s.Evict())
	gone += n / 20
	for rank, i := range lru {
		_, ok := s.shardOf(fmt.Sprint("k", i)).objects[fmt.Sprint("k", i)]
		require.Equal(t, rank >= gone, ok, "rank %d (k%d)", rank, i)
	}
}

// Soft-pinned objects a first pass left are the oldest once their pins
// end: the next eviction takes them first.
func TestEvictionTakesSoftPinnedOnceTheirPinsEnd(t *testing.T) {
	const pinned, n, size = 100, 2000, 1024
	s, clk, exists := pinnedPool(t, ServiceConfig{LeaseTTL: 100 * time.Millisecond}, pinned, n, 150)
	// 15%: the 300 oldest unpinned objects.
	require.Equal(t, uint64(300*size), s.Evict())
	for i := range n {
		require.Equal(t, i < pinned || i >= pinned+300, exists(i), "k%d", i)
	}
	checkEvictOrder(t, s)
	// The pins end; the next eviction (5%) takes the formerly pinned.
	clk.Advance(200 * time.Millisecond)
	s.needEvict.Store(true)
	require.Equal(t, uint64(100*size), s.Evict())
	for i := range n {
		require.Equal(t, i >= pinned+300, exists(i), "k%d", i)
	}
	checkEvictOrder(t, s)
}

// With every unpinned object leased, a forced eviction takes soft-pinned
// objects in its second pass, oldest first.
func TestEvictionSecondPassTakesSoftPinned(t *testing.T) {
	const pinned, n, size = 1000, 2000, 1024
	s, clk, exists := pinnedPool(t, ServiceConfig{}, pinned, n, 3_600_000)
	// 15%: 300 unpinned objects.
	require.Equal(t, uint64(300*size), s.Evict())
	for i := pinned + 300; i < n; i++ {
		_, _, _, _, err := s.GetReplicaList(fmt.Sprint("k", i))
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	for range 3 {
		s.needEvict.Store(true)
		require.Equal(t, uint64(n*size/20), s.Evict())
	}
	for i := range n {
		require.Equal(t, i >= 300 && (i < pinned || i >= pinned+300), exists(i), "k%d", i)
	}
	checkEvictOrder(t, s)
}

// pinnedPool is a full pool of n 1 KiB objects k0..k<n-1>, oldest first, the
// first pinned of them soft-pinned for pinMs, none of them leased;
// exists(i) says whether k<i> is still there.
func pinnedPool(t *testing.T, cfg ServiceConfig, pinned, n int, pinMs int64) (*Service, *fakeClock, func(int) bool) {
	t.Helper()
	s, clk := newTestService(t, cfg)
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, uint64(n)*1024)))
	pin := &storepb.ReplicateConfig{WithSoftPin: true, SoftPinTtlMs: pinMs}
	for i := range n {
		clk.Advance(time.Microsecond)
		rc := pin
		if i >= pinned {
			rc = nil
		}
		put(t, s, "c1", fmt.Sprint("k", i), 1024, rc)
	}
	clk.Advance(time.Millisecond)
	return s, clk, func(i int) bool {
		_, ok := s.shardOf(fmt.Sprint("k", i)).objects[fmt.Sprint("k", i)]
		return ok
	}
}

// When the oldest objects are soft-pinned, the first pass takes the
// unpinned ones, oldest first.
func TestEvictionPassesOverSoftPinned(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{})
	const soft, plain, size = 3000, 1000, 1024
	require.NoError(t, s.MountSegment(t.Context(), "c1", seg("1", 0, (soft+plain)*size)))
	pin := &storepb.ReplicateConfig{WithSoftPin: true, SoftPinTtlMs: 3_600_000}
	for i := range soft {
		clk.Advance(time.Microsecond)
		put(t, s, "c1", fmt.Sprint("s", i), size, pin)
	}
	keys := rand.New(rand.NewPCG(5, 6)).Perm(plain) // put in shuffled order
	for _, i := range keys {
		clk.Advance(time.Microsecond)
		put(t, s, "c1", fmt.Sprint("p", i), size, nil)
	}
	clk.Advance(2 * DefaultLeaseTTL)
	// 15% of the pool is 600 objects.
	visited := s.evictVisited
	require.Equal(t, uint64(600*size), s.Evict())
	for rank, i := range keys {
		_, ok := s.shardOf(fmt.Sprint("p", i)).objects[fmt.Sprint("p", i)]
		require.Equal(t, rank >= 600, ok, "rank %d (p%d)", rank, i)
	}
	assert.Equal(t, soft+plain-600, s.Stats().Keys)
	// The pinned objects are not in the first pass's order: it looked at
	// what it took, and at most one leased head per heap.
	assert.LessOrEqual(t, s.evictVisited-visited, uint64(600+2*DefaultShards))
}

// Puts racing into a full pool all succeed: evictions run one at a time,
// and a put that waited for another's eviction uses the room it made.
func TestConcurrentPutsIntoFullPool(t *testing.T) {
	const n, size = 1000, 1024
	s, _, _ := pinnedPool(t, ServiceConfig{}, 0, n, 0)
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for g := range errs {
		wg.Go(func() {
			_, err := s.PutStart(t.Context(), "c1", fmt.Sprint("new", g), size, nil)
			if err == nil {
				err = s.PutEnd(t.Context(), "c1", fmt.Sprint("new", g), 7)
			}
			errs[g] = err
		})
	}
	wg.Wait()
	for g, err := range errs {
		require.NoError(t, err, "put %d", g)
	}
	// One eviction of 10% of the pool (used - 0.90 + 0.05 from full, or
	// more when several ran) made the room; never all of it.
	assert.Greater(t, s.Stats().Keys, n/2)
}

// Large puts racing into a full pool all succeed too, though one eviction
// makes room for only one or two of them: a put evicts and allocates before
// the next put may evict, and evicts again if the room went to another.
func TestConcurrentLargePutsIntoFullPool(t *testing.T) {
	const n, big = 25000, 1000 * 1024
	s, _, _ := pinnedPool(t, ServiceConfig{}, 0, n, 0)
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for g := range errs {
		wg.Go(func() { _, errs[g] = s.PutStart(t.Context(), "c1", fmt.Sprint("big", g), big, nil) })
	}
	wg.Wait()
	for g, err := range errs {
		require.NoError(t, err, "put %d", g)
	}
}

// BenchmarkEvict is one forced eviction (5% of the pool) in a pool of N
// 1 KiB objects, refilled between evictions: "scan" with a second between
// evictions (before the eviction order, every such eviction scanned the
// pool), "steady" back to back as under a put load.
func BenchmarkEvict(b *testing.B) {
	for _, n := range []int{20_000, 200_000} {
		for _, mode := range []string{"scan", "steady"} {
			b.Run(fmt.Sprintf("%d/%s", n, mode), func(b *testing.B) {
				clk := newFakeClock()
				s, err := NewService(ServiceConfig{Now: clk.Now, Seed: 1})
				require.NoError(b, err)
				require.NoError(b, s.MountSegment(b.Context(), "c1", seg("1", 0, uint64(n)*1024)))
				next := 0
				fill := func(count int) {
					for range count {
						put(b, s, "c1", fmt.Sprint("k", next), 1024, nil)
						next++
						clk.Advance(time.Microsecond)
					}
				}
				fill(n)
				// The eviction's own CPU time, on its thread, with the
				// fill's garbage collected beforehand: the wall time swings
				// with the machine's load.
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var cpu time.Duration
				for b.Loop() {
					b.StopTimer()
					runtime.GC()
					b.StartTimer()
					if mode == "scan" {
						clk.Advance(time.Second + time.Millisecond)
					}
					s.needEvict.Store(true)
					c := threadCPU()
					freed := s.Evict()
					cpu += threadCPU() - c
					b.StopTimer()
					fill(int(freed / 1024))
					b.StartTimer()
				}
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
