package alloc

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// check verifies every structural invariant of the allocator: the blocks
// tile [0, size) in address order with consistent links, no two free blocks
// are adjacent, live blocks are exactly the map's, free blocks are exactly
// those on the class lists (in their right class), the bitmaps match the
// lists, and every node is live, free or spare.
func (a *Allocator) check() error {
	if b := a.nodes[firstNode]; b.off != 0 || b.prev != 0 {
		return fmt.Errorf("first node is %+v", b)
	}
	var off, used uint64
	var prev uint32
	live, free, steps := 0, 0, 0
	prevFree := false
	for i := uint32(firstNode); i != 0; i = a.nodes[i].next {
		if steps++; steps > len(a.nodes) {
			return errors.New("cycle in the address list")
		}
		b := a.nodes[i]
		switch {
		case b.prev != prev:
			return fmt.Errorf("node %d: prev %d, want %d", i, b.prev, prev)
		case b.off != off:
			return fmt.Errorf("node %d at %#x, want %#x (gap or overlap)", i, b.off, off)
		case b.size == 0 || b.size%a.align != 0:
			return fmt.Errorf("node %d: size %d not a positive multiple of %d", i, b.size, a.align)
		case b.free && prevFree:
			return fmt.Errorf("node %d: two adjacent free blocks at %#x", i, b.off)
		}
		if li, ok := a.live[b.off]; b.free == ok || (ok && li != i) {
			return fmt.Errorf("node %d (free=%v) at %#x: live map says %d,%v", i, b.free, b.off, li, ok)
		}
		if b.free {
			free++
		} else {
			live++
			used += b.size
		}
		prevFree, prev, off = b.free, i, off+b.size
	}
	switch {
	case off != a.size:
		return fmt.Errorf("blocks cover %#x bytes, want %#x", off, a.size)
	case used != a.used:
		return fmt.Errorf("used %d, blocks sum to %d", a.used, used)
	case live != len(a.live):
		return fmt.Errorf("%d live blocks, map has %d", live, len(a.live))
	case free != a.freeBlocks:
		return fmt.Errorf("%d free blocks, counter says %d", free, a.freeBlocks)
	}
	listed := 0
	for c := range numClasses {
		var pf uint32
		for i := a.heads[c]; i != 0; i = a.nodes[i].nextFree {
			if listed++; listed > len(a.nodes) {
				return errors.New("cycle in a class list")
			}
			b := a.nodes[i]
			if !b.free || classOf(b.size>>a.shift) != c || b.prevFree != pf {
				return fmt.Errorf("class %d: bad node %d %+v", c, i, b)
			}
			pf = i
		}
		grp, bit := c>>classBits, uint16(1)<<(c&(classesPerGroup-1))
		if (a.heads[c] != 0) != (a.classMap[grp]&bit != 0) {
			return fmt.Errorf("class %d: bitmap disagrees with list", c)
		}
	}
	for grp := range numGroups {
		if (a.classMap[grp] != 0) != (a.groupMap&(1<<grp) != 0) {
			return fmt.Errorf("group %d: group bitmap disagrees", grp)
		}
	}
	if listed != free {
		return fmt.Errorf("%d blocks on class lists, %d free", listed, free)
	}
	spare := 0
	for i := a.spare; i != 0; i = a.nodes[i].nextFree {
		if spare++; spare > len(a.nodes) {
			return errors.New("cycle in the spare list")
		}
	}
	if live+free+spare != len(a.nodes)-1 {
		return fmt.Errorf("node leak: %d live + %d free + %d spare != %d", live, free, spare, len(a.nodes)-1)
	}
	return nil
}

// allocHarness drives an allocator against a reference model: the set of
// live allocations with their rounded sizes.
type allocHarness struct {
	a       segAllocator
	align   uint64
	check   func() error                    // internal invariants; nil for the yardstick
	mayFail func(largest, size uint64) bool // whether Alloc(size) may fail given LargestFree
	live    map[uint64]uint64
	offs    []uint64 // live offsets, to pick from
	freed   []uint64 // freed offsets, for double frees
	used    uint64
}

func newOurHarness(a *Allocator) *allocHarness {
	return &allocHarness{
		a: a, align: a.Alignment(), check: a.check, live: map[uint64]uint64{},
		// Failure is allowed only if nothing fits, or what fits is in the
		// request's own class (the bounded scan may miss it).
		mayFail: func(largest, size uint64) bool {
			return largest < size || classOf(largest>>a.shift) == classOf(size>>a.shift)
		},
	}
}

func newFirstFitHarness(f *firstFitAlloc) *allocHarness {
	return &allocHarness{
		a: f, align: f.align, live: map[uint64]uint64{},
		mayFail: func(largest, size uint64) bool { return largest < size },
	}
}

func (h *allocHarness) roundUp(n uint64) uint64 { return (n + h.align - 1) &^ (h.align - 1) }

// verify compares the allocator's accounting with the model.
func (h *allocHarness) verify() error {
	if u := h.a.Used(); u != h.used {
		return fmt.Errorf("Used() = %d, model %d", u, h.used)
	}
	if lf := h.a.LargestFree(); lf > h.a.Size()-h.used {
		return fmt.Errorf("LargestFree() = %d > free bytes %d", lf, h.a.Size()-h.used)
	}
	if h.check != nil {
		return h.check()
	}
	return nil
}

func (h *allocHarness) alloc(n uint64) error {
	largest := h.a.LargestFree()
	off, ok := h.a.Alloc(n)
	if !ok {
		if n != 0 && n <= h.a.Size() && !h.mayFail(largest, h.roundUp(n)) {
			return fmt.Errorf("Alloc(%d) failed with LargestFree %d", n, largest)
		}
		return h.verify()
	}
	if n == 0 || n > h.a.Size() {
		return fmt.Errorf("Alloc(%d) succeeded", n)
	}
	r := h.roundUp(n)
	if off%h.align != 0 || off > h.a.Size() || r > h.a.Size()-off {
		return fmt.Errorf("Alloc(%d) = %#x: misaligned or out of [0, %#x)", n, off, h.a.Size())
	}
	for o, s := range h.live {
		if off < o+s && o < off+r {
			return fmt.Errorf("Alloc(%d) = [%#x,+%d) overlaps live [%#x,+%d)", n, off, r, o, s)
		}
	}
	h.live[off] = r
	h.offs = append(h.offs, off)
	h.used += r
	return h.verify()
}

// free frees the live allocation offs[i mod len].
func (h *allocHarness) free(i int) error {
	if len(h.offs) == 0 {
		return nil
	}
	i %= len(h.offs)
	off := h.offs[i]
	if err := h.a.Free(off); err != nil {
		return fmt.Errorf("Free(%#x) of a live allocation: %v", off, err)
	}
	h.used -= h.live[off]
	delete(h.live, off)
	h.offs[i] = h.offs[len(h.offs)-1]
	h.offs = h.offs[:len(h.offs)-1]
	h.freed = append(h.freed, off)
	return h.verify()
}

// bogusFree frees off, which must fail unless off is live.
func (h *allocHarness) bogusFree(off uint64) error {
	if _, ok := h.live[off]; ok {
		return nil
	}
	if err := h.a.Free(off); !errors.Is(err, ErrNotAllocated) {
		return fmt.Errorf("Free(%#x) of a non-live offset: %v", off, err)
	}
	return h.verify()
}

// doubleFree frees again an offset freed earlier.
func (h *allocHarness) doubleFree(i int) error {
	if len(h.freed) == 0 {
		return nil
	}
	return h.bogusFree(h.freed[i%len(h.freed)])
}

// finish frees everything and expects one free block of the whole segment.
func (h *allocHarness) finish() error {
	for len(h.offs) > 0 {
		if err := h.free(0); err != nil {
			return err
		}
	}
	if u, lf := h.a.Used(), h.a.LargestFree(); u != 0 || lf != h.a.Size() {
		return fmt.Errorf("all freed: Used %d, LargestFree %d, want 0, %d", u, lf, h.a.Size())
	}
	return nil
}

func TestNewAllocator(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size      uint64
		opts      []Option
		wantSize  uint64
		wantAlign uint64
		wantErr   string
	}{
		// The default alignment is a cache line.
		{name: "default", size: 1 << 20, wantSize: 1 << 20, wantAlign: 64},
		// A ragged tail is not managed: the size rounds down.
		{name: "ragged size rounds down", size: 1000, wantSize: 960, wantAlign: 64},
		// Byte granularity manages every byte.
		{name: "alignment 1", size: 1000, opts: []Option{WithAlignment(1)}, wantSize: 1000, wantAlign: 1},
		// Zero means the default.
		{name: "alignment 0", size: 4096, opts: []Option{WithAlignment(0)}, wantSize: 4096, wantAlign: 64},
		// Page alignment for O_DIRECT spills.
		{name: "page alignment", size: 10000, opts: []Option{WithAlignment(4096)}, wantSize: 8192, wantAlign: 4096},
		// The largest possible segment.
		{name: "max size", size: math.MaxUint64, wantSize: math.MaxUint64 &^ 63, wantAlign: 64},
		// Alignments must be powers of two.
		{name: "alignment 48", size: 4096, opts: []Option{WithAlignment(48)}, wantErr: "alignment 48"},
		// Nothing left to manage.
		{name: "smaller than alignment", size: 63, wantErr: "size 63"},
		// Nothing at all.
		{name: "zero size", size: 0, wantErr: "size 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.size, tc.opts...)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalid)
				require.ErrorContains(t, err, tc.wantErr, "the error names the bad value")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantSize, a.Size())
			assert.Equal(t, tc.wantAlign, a.Alignment())
			assert.Equal(t, tc.wantSize, a.LargestFree())
			assert.Equal(t, tc.wantSize, a.FreeBytes())
			assert.Zero(t, a.Used())
			require.NoError(t, a.check())
		})
	}
}

// allocStep is one operation of TestAllocatorSteps and what follows it.
type allocStep struct {
	alloc   uint64 // bytes to allocate (when free is false)
	free    bool
	off     int64 // alloc: the offset expected, -1 for failure; free: the offset freed
	used    uint64
	largest uint64
	blocks  int // free blocks after the step
}

func TestAllocatorSteps(t *testing.T) {
	const g = 64 // granule
	a := func(n uint64, off int64, used, largest uint64, blocks int) allocStep {
		return allocStep{alloc: n, off: off, used: used, largest: largest, blocks: blocks}
	}
	f := func(off int64, used, largest uint64, blocks int) allocStep {
		return allocStep{free: true, off: off, used: used, largest: largest, blocks: blocks}
	}
	for _, tc := range []struct {
		name  string
		size  uint64
		steps []allocStep
	}{
		// Sizes round up to the granule and pack from offset 0.
		{"rounds up and packs", 1024, []allocStep{
			a(1, 0, g, 1024-g, 1),
			a(64, 64, 2*g, 1024-2*g, 1),
			a(65, 128, 4*g, 1024-4*g, 1),
		}},
		// Freeing the last block merges it into the free tail.
		{"free merges with the tail", 1024, []allocStep{
			a(64, 0, g, 960, 1),
			a(64, 64, 2*g, 896, 1),
			f(64, g, 960, 1),
			f(0, 0, 1024, 1),
		}},
		// A hole of the request's size is reused rather than the tail split.
		{"equal-size hole reused", 1024, []allocStep{
			a(128, 0, 128, 896, 1),
			a(128, 128, 256, 768, 1),
			a(128, 256, 384, 640, 1),
			f(128, 256, 640, 2),
			a(128, 128, 384, 640, 1),
		}},
		// Filling the segment, then freeing both neighbours of a block and
		// the block: three merge into one.
		{"three-way merge", 1024, []allocStep{
			a(256, 0, 256, 768, 1),
			a(256, 256, 512, 512, 1),
			a(256, 512, 768, 256, 1),
			a(256, 768, 1024, 0, 0),
			a(1, -1, 1024, 0, 0),
			f(0, 768, 256, 1),
			f(512, 512, 256, 2),
			f(256, 256, 768, 1),
			f(768, 0, 1024, 1),
		}},
		// Of two holes the tighter one is taken: 33 granules go to the
		// 33-granule hole although the 32..33 class also holds a 32 one,
		// and the 32-granule request then takes the 32 hole.
		{"best fit within a class", 1 << 20, []allocStep{
			a(33*g, 0, 33*g, 1<<20-33*g, 1),
			a(g, 33*g, 34*g, 1<<20-34*g, 1),
			a(32*g, 34*g, 66*g, 1<<20-66*g, 1),
			a(g, 66*g, 67*g, 1<<20-67*g, 1),
			f(0, 34*g, 1<<20-67*g, 2),
			f(34*g, 2*g, 1<<20-67*g, 3),
			a(33*g, 0, 35*g, 1<<20-67*g, 2),
			a(32*g, 34*g, 67*g, 1<<20-67*g, 1),
		}},
		// A request that only a larger class can hold splits its head block.
		{"split from a larger class", 1 << 20, []allocStep{
			a(100*g, 0, 100*g, 1<<20-100*g, 1),
			a(g, 100*g, 101*g, 1<<20-101*g, 1),
			f(0, g, 1<<20-101*g, 2),
			a(40*g, 0, 41*g, 1<<20-101*g, 2),
			a(60*g, 40*g, 101*g, 1<<20-101*g, 1),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			al, err := New(tc.size)
			require.NoError(t, err)
			for i, s := range tc.steps {
				if s.free {
					require.NoError(t, al.Free(uint64(s.off)), "step %d", i)
				} else {
					off, ok := al.Alloc(s.alloc)
					if s.off < 0 {
						require.False(t, ok, "step %d: Alloc(%d) = %d", i, s.alloc, off)
					} else {
						require.True(t, ok, "step %d: Alloc(%d)", i, s.alloc)
						require.Equal(t, uint64(s.off), off, "step %d: Alloc(%d)", i, s.alloc)
					}
				}
				st := al.Stats()
				require.Equal(t, s.used, st.Used, "step %d: used", i)
				require.Equal(t, s.largest, st.LargestFree, "step %d: largest free", i)
				require.Equal(t, s.blocks, st.FreeBlocks, "step %d: free blocks", i)
				require.NoError(t, al.check(), "step %d", i)
			}
		})
	}
}

func TestAllocatorRejects(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		name    string
		prefill uint64 // bytes allocated first
		n       uint64
		wantOK  bool
	}{
		// Zero bytes is not a request.
		{"zero", 0, 0, false},
		// One byte more than the segment.
		{"size+1", 0, size + 1, false},
		// Would overflow any rounding.
		{"max uint64", 0, math.MaxUint64, false},
		// The whole segment fits an empty segment...
		{"whole segment", 0, size, true},
		// ...but not one with anything allocated.
		{"whole segment, partly used", 64, size, false},
		// The exact remainder fits.
		{"exact remainder", 4096, size - 4096, true},
		// One byte over the remainder does not.
		{"remainder+1", 4096, size - 4096 + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(size)
			require.NoError(t, err)
			if tc.prefill > 0 {
				_, ok := a.Alloc(tc.prefill)
				require.True(t, ok)
			}
			before := a.Stats()
			off, ok := a.Alloc(tc.n)
			require.Equal(t, tc.wantOK, ok)
			after := a.Stats()
			if !ok {
				assert.Zero(t, off)
				assert.Equal(t, before.Failed+1, after.Failed)
				after.Failed = before.Failed
				assert.Equal(t, before, after, "a failed Alloc changed the state")
			} else {
				assert.Equal(t, tc.prefill, off)
				assert.Equal(t, uint64(size), a.Used())
			}
			require.NoError(t, a.check())
		})
	}
}

func TestAllocatorExhaustion(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  uint64
		block uint64
	}{
		// Power-of-two blocks fill the segment exactly.
		{"256KiB blocks", 64 << 20, 256 << 10},
		// Blocks that are not a class boundary, with a ragged end.
		{"640KiB blocks", 64<<20 + 100<<10, 640 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.size)
			require.NoError(t, err)
			var offs []uint64
			for {
				off, ok := a.Alloc(tc.block)
				if !ok {
					break
				}
				offs = append(offs, off)
			}
			require.Len(t, offs, int(a.Size()/tc.block))
			require.Equal(t, uint64(len(offs))*tc.block, a.Used())
			// Full: more requests fail and change nothing.
			before := a.Stats()
			for _, n := range []uint64{tc.block, a.FreeBytes() + 1, a.Size()} {
				_, ok := a.Alloc(n)
				require.False(t, ok)
			}
			after := a.Stats()
			require.Equal(t, before.Failed+3, after.Failed)
			after.Failed = before.Failed
			require.Equal(t, before, after)
			require.NoError(t, a.check())
			// A freed block is the one given back next.
			mid := offs[len(offs)/2]
			require.NoError(t, a.Free(mid))
			off, ok := a.Alloc(tc.block)
			require.True(t, ok)
			require.Equal(t, mid, off)
			require.NoError(t, a.check())
		})
	}
}

// TestAllocatorCoalesce fills a segment with mixed sizes and frees it all in
// random order: it must end as one free block.
func TestAllocatorCoalesce(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			a, err := New(16<<20 + 12345)
			require.NoError(t, err)
			var offs []uint64
			for fails := 0; fails < 20; {
				if off, ok := a.Alloc(1 + rng.Uint64N(256<<10)); ok {
					offs = append(offs, off)
				} else {
					fails++
				}
			}
			rng.Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
			for i, off := range offs {
				require.NoError(t, a.Free(off))
				if i%16 == 0 {
					require.NoError(t, a.check())
				}
			}
			st := a.Stats()
			require.Equal(t, 1, st.FreeBlocks)
			require.Zero(t, st.Used)
			require.Equal(t, a.Size(), st.LargestFree)
			require.Zero(t, st.Fragmentation())
			require.NoError(t, a.check())
			off, ok := a.Alloc(a.Size())
			require.True(t, ok)
			require.Zero(t, off)
		})
	}
}

func TestAllocatorFreeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  func(live []uint64) uint64
	}{
		// The second free of an offset.
		{"double free", func(live []uint64) uint64 { return live[0] }},
		// An offset inside a live allocation.
		{"interior of a live block", func(live []uint64) uint64 { return live[1] + 64 }},
		// The start of the free tail.
		{"start of a free block", func(live []uint64) uint64 { return live[2] + 4096 }},
		// Beyond the segment.
		{"beyond the segment", func([]uint64) uint64 { return 1 << 40 }},
		// Not on the granule.
		{"misaligned", func(live []uint64) uint64 { return live[1] + 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(1 << 20)
			require.NoError(t, err)
			var live []uint64
			for range 3 {
				off, ok := a.Alloc(4096)
				require.True(t, ok)
				live = append(live, off)
			}
			require.NoError(t, a.Free(live[0]))
			before := a.Stats()
			err = a.Free(tc.off(live))
			require.ErrorIs(t, err, ErrNotAllocated)
			require.Equal(t, before, a.Stats())
			require.NoError(t, a.check())
			// The allocator still works.
			for _, off := range live[1:] {
				require.NoError(t, a.Free(off))
			}
			require.Equal(t, a.Size(), a.LargestFree())
		})
	}
}

func TestAllocatorAlignment(t *testing.T) {
	for _, align := range []uint64{1, 8, 64, 4096, 2 << 20} {
		t.Run(fmt.Sprint(align), func(t *testing.T) {
			a, err := New(256<<20+3, WithAlignment(align))
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(align, 1))
			var want uint64
			for range 200 {
				n := 1 + rng.Uint64N(1<<20)
				off, ok := a.Alloc(n)
				if !ok {
					continue
				}
				rounded := (n + align - 1) / align * align
				require.Zero(t, off%align, "Alloc(%d) = %#x", n, off)
				got, ok := a.SizeOf(off)
				require.True(t, ok)
				require.Equal(t, rounded, got)
				want += rounded
			}
			require.Equal(t, want, a.Used())
			require.NoError(t, a.check())
		})
	}
}

// TestClassOf checks that classes tile the sizes in order, each class
// spanning at most 1/16 of its lower bound.
func TestClassOf(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	gs := []uint64{1, 15, 16, 17, 31, 32, 33, 1 << 20, 1<<20 + 1, math.MaxUint64 >> 6, math.MaxUint64 - 1, math.MaxUint64}
	for g := uint64(1); g < 5000; g++ {
		gs = append(gs, g)
	}
	for range 10000 {
		gs = append(gs, max(1, rng.Uint64()>>rng.IntN(64)))
	}
	for _, g := range gs {
		c := classOf(g)
		require.Less(t, c, numClasses, "g=%d", g)
		require.LessOrEqual(t, classLow(c), g, "g=%d", g)
		if c+1 < numClasses {
			hi := classLow(c + 1)
			require.Less(t, g, hi, "g=%d", g)
			require.LessOrEqual(t, hi-classLow(c), max(1, classLow(c)/16), "class %d", c)
		}
		require.Equal(t, c, classOf(classLow(c)), "g=%d", g)
	}
	require.Equal(t, numClasses-1, classOf(math.MaxUint64))
}

// TestAllocatorRandomized runs thousands of seeded random operations
// against the reference model, alternating fill-heavy and drain-heavy
// phases so the segment is often full.
func TestAllocatorRandomized(t *testing.T) {
	ops := 6000
	if testing.Short() {
		ops = 1500
	}
	for _, align := range []uint64{1, 64, 4096} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("align%d/seed%d", align, seed), func(t *testing.T) {
				a, err := New(4<<20+123, WithAlignment(align))
				require.NoError(t, err)
				h := newOurHarness(a)
				require.NoError(t, randomOps(h, rand.New(rand.NewPCG(seed, align)), ops))
				require.NoError(t, h.finish())
				require.Equal(t, 1, a.Stats().FreeBlocks)
			})
		}
	}
}

// TestFirstFitYardstick holds the benchmark's yardstick to the same model.
func TestFirstFitYardstick(t *testing.T) {
	h := newFirstFitHarness(newFirstFitAlloc(4<<20+123, 64))
	require.NoError(t, randomOps(h, rand.New(rand.NewPCG(9, 9)), 3000))
	require.NoError(t, h.finish())
}

func randomOps(h *allocHarness, rng *rand.Rand, ops int) error {
	kv := []uint64{16 << 10, 40 << 10, 64 << 10, 100<<10 + 1}
	for i := range ops {
		pAlloc := 0.75
		if (i/500)%2 == 1 {
			pAlloc = 0.3
		}
		var err error
		switch r := rng.Float64(); {
		case r < pAlloc:
			var n uint64
			switch s := rng.Float64(); {
			case s < 0.7:
				n = kv[rng.IntN(len(kv))]
			case s < 0.9:
				n = 1 + rng.Uint64N(8<<10)
			case s < 0.97:
				n = 256<<10 + rng.Uint64N(768<<10)
			default:
				n = []uint64{0, h.a.Size(), h.a.Size() + 1, math.MaxUint64}[rng.IntN(4)]
			}
			err = h.alloc(n)
		case r < 0.9:
			err = h.free(rng.IntN(1 << 30))
		case r < 0.95:
			err = h.bogusFree(rng.Uint64N(h.a.Size() + 1024))
		default:
			err = h.doubleFree(rng.IntN(1 << 30))
		}
		if err != nil {
			return fmt.Errorf("op %d: %w", i, err)
		}
	}
	return nil
}

// FuzzAllocator drives the allocator with operations decoded from bytes:
// the first two bytes pick the alignment and size, then each 3 bytes are
// an operation and its argument.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{6, 15, 0, 0x10, 0, 0, 0x20, 0, 2, 0, 0, 3, 0xff, 0xff, 4, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 1, 5, 0xff, 0xff, 2, 0, 1, 4, 0, 0, 1, 0, 1})
	f.Add([]byte{12, 255, 0xff, 0xff, 0xff, 0x40, 0, 0, 0x41, 0, 0, 2, 0, 0, 2, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		align := uint64(1) << (data[0] % 13)
		a, err := New((uint64(data[1])+1)<<12+uint64(data[0]), WithAlignment(align))
		if err != nil {
			return // smaller than its alignment
		}
		h := newOurHarness(a)
		for data = data[2:]; len(data) >= 3; data = data[3:] {
			op, x := data[0], uint64(data[1])<<8|uint64(data[2])
			switch op % 5 {
			case 0, 1:
				err = h.alloc(x * uint64(1+op/5%32))
			case 2:
				err = h.free(int(x))
			case 3:
				err = h.bogusFree(x * uint64(1+op/5))
			case 4:
				err = h.doubleFree(int(x))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := h.finish(); err != nil {
			t.Fatal(err)
		}
		if err := a.check(); err != nil {
			t.Fatal(err)
		}
	})
}

func ExampleAllocator() {
	a, err := New(1 << 20) // a 1 MiB segment
	if err != nil {
		panic(err)
	}
	x, _ := a.Alloc(300 << 10)
	y, _ := a.Alloc(100) // rounded up to 128 bytes
	fmt.Println(x, y, a.Used())
	fmt.Println(a.Free(x) == nil, errors.Is(a.Free(x), ErrNotAllocated))
	_ = a.Free(y)
	fmt.Println(a.LargestFree() == a.Size())
	// Output:
	// 0 307200 307328
	// true true
	// true
}
