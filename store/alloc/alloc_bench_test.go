package alloc

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// segAllocator is what the benchmarks and the model tests need of an
// allocator, so the yardstick runs the same code.
type segAllocator interface {
	Alloc(n uint64) (uint64, bool)
	Free(off uint64) error
	Size() uint64
	Used() uint64
	LargestFree() uint64
}

var (
	_ segAllocator = (*Allocator)(nil)
	_ segAllocator = (*firstFitAlloc)(nil)
)

// firstFitAlloc is the yardstick: the textbook allocator, a free list
// sorted by offset, scanned from the start for the first block that fits,
// merged with its neighbours on free. Address-ordered first fit packs well
// but costs O(free blocks) per call.
type firstFitAlloc struct {
	size, align, used uint64
	free              []ffExtent // sorted by off, never adjacent
	live              map[uint64]uint64
}

type ffExtent struct{ off, size uint64 }

func newFirstFitAlloc(size, align uint64) *firstFitAlloc {
	size &^= align - 1
	return &firstFitAlloc{size: size, align: align, free: []ffExtent{{0, size}}, live: map[uint64]uint64{}}
}

func (f *firstFitAlloc) Alloc(n uint64) (uint64, bool) {
	if n == 0 || n > f.size {
		return 0, false
	}
	s := (n + f.align - 1) &^ (f.align - 1)
	for i := range f.free {
		e := &f.free[i]
		if e.size < s {
			continue
		}
		off := e.off
		if e.size == s {
			f.free = slices.Delete(f.free, i, i+1)
		} else {
			e.off, e.size = e.off+s, e.size-s
		}
		f.live[off] = s
		f.used += s
		return off, true
	}
	return 0, false
}

func (f *firstFitAlloc) Free(off uint64) error {
	s, ok := f.live[off]
	if !ok {
		return fmt.Errorf("%w: %#x", ErrNotAllocated, off)
	}
	delete(f.live, off)
	f.used -= s
	i, _ := slices.BinarySearchFunc(f.free, off, func(e ffExtent, off uint64) int { return cmp.Compare(e.off, off) })
	prev := i > 0 && f.free[i-1].off+f.free[i-1].size == off
	next := i < len(f.free) && off+s == f.free[i].off
	switch {
	case prev && next:
		f.free[i-1].size += s + f.free[i].size
		f.free = slices.Delete(f.free, i, i+1)
	case prev:
		f.free[i-1].size += s
	case next:
		f.free[i].off, f.free[i].size = off, f.free[i].size+s
	default:
		f.free = slices.Insert(f.free, i, ffExtent{off, s})
	}
	return nil
}

func (f *firstFitAlloc) Size() uint64 { return f.size }
func (f *firstFitAlloc) Used() uint64 { return f.used }
func (f *firstFitAlloc) LargestFree() uint64 {
	var m uint64
	for _, e := range f.free {
		m = max(m, e.size)
	}
	return m
}

// kvBlockSizes are KV-cache blocks of 512 tokens from a few model shapes
// sharing the pool: 512 B/token, MLA in fp8 (656 B/token, not a size-class
// boundary) and in bf16 (1152 B/token), 2 and 4 KiB/token.
var kvBlockSizes = []uint64{256 << 10, 512 * 656, 512 * 1152, 1 << 20, 2 << 20}

// kvDraw returns a request size: with probability large an object of
// 8..64 MiB (4 KiB multiples), else a KV block.
func kvDraw(rng *rand.Rand, large float64) uint64 {
	if large > 0 && rng.Float64() < large {
		return (8<<20 + rng.Uint64N(56<<20+1)) &^ 4095
	}
	return kvBlockSizes[rng.IntN(len(kvBlockSizes))]
}

// BenchmarkAllocFree measures replacing an object in a 64 GiB segment kept
// 90% full of KV blocks and 5% large objects: one Free of a random object,
// then Allocs until the segment is 90% full again (a failed Alloc evicts
// another random object and is retried), so one op is about one Free and one Alloc
// (ns/call is per call). A churn of twice the live count scatters the free
// space before the timer starts. The first-fit yardstick runs the same
// sequence.
func BenchmarkAllocFree(b *testing.B) {
	const size, target = 64 << 30, 64 << 30 * 9 / 10
	for _, impl := range []struct {
		name string
		new  func() segAllocator
	}{
		{"ours", func() segAllocator { a, _ := New(size); return a }},
		{"firstfit", func() segAllocator { return newFirstFitAlloc(size, DefaultAlignment) }},
	} {
		b.Run(impl.name, func(b *testing.B) {
			a := impl.new()
			rng := rand.New(rand.NewPCG(1, 2))
			var live []uint64
			calls := 0
			drop := func() {
				i := rng.IntN(len(live))
				if err := a.Free(live[i]); err != nil {
					b.Fatal(err)
				}
				calls++
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
			}
			fill := func() {
				for a.Used() < target {
					n := kvDraw(rng, 0.05)
					for {
						off, ok := a.Alloc(n)
						calls++
						if ok {
							live = append(live, off)
							break
						}
						drop()
					}
				}
			}
			fill()
			for range 2 * len(live) {
				drop()
				fill()
			}
			calls = 0
			b.ResetTimer()
			for range b.N {
				drop()
				fill()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(calls), "ns/call")
			b.ReportMetric(float64(len(live)), "objects")
		})
	}
}

// kvResult is what one run of the KV workload measured.
type kvResult struct {
	utilFirst float64 // used/size at the first failed Alloc at steady state
	utilSum   float64 // sum of used/size over the steady-state failures
	failures  int
	calls     int // Alloc and Free calls
	elapsed   time.Duration
}

// kvRun fills a with the KV workload until 20 segments' worth of bytes were
// written. New objects are appended to an LRU order; 10% of the time a
// random object is removed first (a client Remove or an upsert); when an
// Alloc fails the oldest object is evicted (a random one 25% of the time,
// as leases and pins reorder Mooncake's near-LRU) and the Alloc retried.
// After 4 segments' worth (steady state) each request's first failure
// records the utilisation.
func kvRun(a segAllocator, seed uint64, large float64) kvResult {
	type object struct {
		off   uint64
		pos   int // index in live
		alive bool
	}
	var (
		res     kvResult
		rng     = rand.New(rand.NewPCG(seed, 0x6b76))
		objs    []object // by id, in insertion (LRU) order
		live    []int    // ids of live objects
		lru     int      // no live object has a smaller id
		written uint64
		size    = a.Size()
	)
	remove := func(id int) {
		o := &objs[id]
		if err := a.Free(o.off); err != nil {
			panic(err)
		}
		res.calls++
		o.alive = false
		last := live[len(live)-1]
		live[o.pos], objs[last].pos = last, o.pos
		live = live[:len(live)-1]
	}
	start := time.Now()
	for written < 20*size {
		if len(live) > 0 && rng.Float64() < 0.1 {
			remove(live[rng.IntN(len(live))])
		}
		n := kvDraw(rng, large)
		for failed := false; ; failed = true {
			off, ok := a.Alloc(n)
			res.calls++
			if ok {
				live = append(live, len(objs))
				objs = append(objs, object{off: off, pos: len(live) - 1, alive: true})
				written += n
				break
			}
			if !failed && written >= 4*size {
				u := float64(a.Used()) / float64(size)
				if res.failures == 0 {
					res.utilFirst = u
				}
				res.utilSum += u
				res.failures++
			}
			if rng.Float64() < 0.25 {
				remove(live[rng.IntN(len(live))])
				continue
			}
			for !objs[lru].alive {
				lru++
			}
			remove(lru)
		}
	}
	res.elapsed = time.Since(start)
	return res
}

// BenchmarkKVUtilization runs the KV workload on a 1 GiB segment with our
// allocator and with the first-fit yardstick, on the same request stream
// (seed = iteration), and reports for each the utilisation at the first
// failure at steady state (util), its mean over all steady-state failures
// (util-mean) and the mean time per Alloc or Free call (ns/call).
// ns/op is one iteration: both runs.
func BenchmarkKVUtilization(b *testing.B) {
	for _, mix := range []struct {
		name  string
		large float64
	}{
		{"kv", 0},
		{"kv+5%large", 0.05},
	} {
		b.Run(mix.name, func(b *testing.B) {
			var ours, ff kvResult
			for i := range b.N {
				a, err := New(1 << 30)
				if err != nil {
					b.Fatal(err)
				}
				ours.add(kvRun(a, uint64(i)+1, mix.large))
				ff.add(kvRun(newFirstFitAlloc(1<<30, DefaultAlignment), uint64(i)+1, mix.large))
			}
			n := float64(b.N)
			b.ReportMetric(ours.utilFirst/n, "util")
			b.ReportMetric(ours.utilSum/float64(ours.failures), "util-mean")
			b.ReportMetric(ours.nsPerCall(), "ns/call")
			b.ReportMetric(ff.utilFirst/n, "ff-util")
			b.ReportMetric(ff.utilSum/float64(ff.failures), "ff-util-mean")
			b.ReportMetric(ff.nsPerCall(), "ff-ns/call")
		})
	}
}

func (r *kvResult) add(o kvResult) {
	r.utilFirst += o.utilFirst
	r.utilSum += o.utilSum
	r.failures += o.failures
	r.calls += o.calls
	r.elapsed += o.elapsed
}

func (r *kvResult) nsPerCall() float64 { return float64(r.elapsed.Nanoseconds()) / float64(r.calls) }
