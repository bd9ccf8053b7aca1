package alloc

import (
	"errors"
	"fmt"
	"math/bits"
)

// The allocator is a two-level segregated fit (TLSF): free blocks sit in
// lists by size class, two bitmaps say which lists are non-empty, and a
// class with room for a request is found with two bit scans. Blocks also
// form an address-ordered doubly linked list, so a freed block merges with
// free neighbours at once and no two free blocks are ever adjacent.
//
// Size classes are small floating-point numbers over granules (the
// alignment): below 2^classBits granules every size is its own class; above,
// a class is an exponent and classBits mantissa bits, so each power of two
// is cut into 16 classes and a class spans at most 1/16 (6.25%) of its
// lower bound. Mooncake's offset allocator uses the same idea with 8 classes
// per power of two; 16 halves the slack between a request and the block a
// class search returns, for a few more bitmap words.
const (
	classBits       = 4
	classesPerGroup = 1 << classBits
	// Group 0 holds the linear classes; group k>0 the sizes with bit length
	// k+classBits. 64-bit sizes need 64-classBits+1 groups, which fits the
	// uint64 group bitmap.
	numGroups  = 64 - classBits + 1
	numClasses = numGroups * classesPerGroup

	// fitScan bounds the walk over the request's own class looking for the
	// best fitting block, so Alloc stays O(1).
	fitScan = 16

	// firstNode is the node of the block at offset 0. It is never merged
	// away (it has no lower neighbour) nor recycled.
	firstNode = 1
)

// DefaultAlignment is the default alignment of offsets and granule of
// sizes: one CPU cache line. Replicas never share a line, memcpy and NIC DMA
// run at full speed, and the rounding wastes under 64 bytes per object,
// nothing against KV blocks of hundreds of KiB. Block metadata is per block,
// not per granule, so a coarser granule would save no memory.
const DefaultAlignment = 64

// ErrNotAllocated is returned by Allocator.Free for an offset that is not
// the start of a live allocation: a double free, or an offset the allocator
// never returned.
var ErrNotAllocated = errors.New("alloc: offset not allocated")

// ErrInvalid is the cause of a New refused: an alignment that is not a
// power of two, or a size that leaves nothing to manage.
var ErrInvalid = errors.New("alloc: invalid allocator")

// Option configures New.
type Option func(*config)

type config struct {
	alignment uint64
}

// WithAlignment sets the alignment of every offset and the granule
// every size is rounded up to. It must be a power of two; zero means
// DefaultAlignment. Page alignment (4096) suits replicas that are also
// written to disk with O_DIRECT.
func WithAlignment(n uint64) Option {
	return func(c *config) { c.alignment = n }
}

// Allocator hands out ranges of one segment as offsets in [0, Size()); the
// master adds the segment's base address. Offsets are multiples of the
// alignment, so addresses are aligned when the base is (mounted segments are
// page-aligned). Allocation sizes are rounded up to the alignment; Used
// counts rounded sizes.
//
// Alloc and Free are O(1): a few bit scans, at most fitScan list steps and
// one map operation. Metadata is one 40-byte node per block (live or free;
// there are at most 2·live+1 blocks) plus one map entry per live block;
// nodes are recycled, never per byte.
//
// Placement is best fit by class, most recently freed first: holes of a
// KV block's exact size are reused at once, which is why a KV-only mix
// fills ~96% of a segment before the first failure where address-ordered
// first fit reaches ~93% (BenchmarkKVUtilization). When large objects carry
// most of the bytes, first fit's drift of small blocks to low addresses
// keeps bigger holes and it packs better (~86% vs ~80%).
//
// An Allocator is not safe for concurrent use: the master serialises the
// calls on each segment, the client's staging buffer holds a mutex.
type Allocator struct {
	size  uint64 // usable bytes, a multiple of align
	align uint64
	shift uint // log2(align)
	used  uint64

	nodes []node            // nodes[0] is unused: index 0 means none
	spare uint32            // recycled nodes, linked by nextFree
	live  map[uint64]uint32 // offset of each allocated block -> node

	heads    [numClasses]uint32 // free list of each class
	classMap [numGroups]uint16  // bit m of classMap[k]: class k<<classBits|m non-empty
	groupMap uint64             // bit k: classMap[k] != 0

	freeBlocks            int
	allocs, frees, failed uint64
}

// node is one block: allocated, or free and on its class's list.
type node struct {
	off, size          uint64
	prev, next         uint32 // address-order neighbours
	prevFree, nextFree uint32 // class list neighbours while free
	free               bool
}

// New returns an allocator of size bytes, all free. Size is rounded
// down to the alignment and must leave at least one granule.
func New(size uint64, opts ...Option) (*Allocator, error) {
	cfg := config{alignment: DefaultAlignment}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.alignment == 0 {
		cfg.alignment = DefaultAlignment
	}
	if cfg.alignment&(cfg.alignment-1) != 0 {
		return nil, fmt.Errorf("%w: alignment %d is not a power of two", ErrInvalid, cfg.alignment)
	}
	usable := size &^ (cfg.alignment - 1)
	if usable == 0 {
		return nil, fmt.Errorf("%w: size %d is smaller than its alignment %d", ErrInvalid, size, cfg.alignment)
	}
	a := &Allocator{
		size:  usable,
		align: cfg.alignment,
		shift: uint(bits.TrailingZeros64(cfg.alignment)),
		nodes: make([]node, 1, 64),
		live:  make(map[uint64]uint32),
	}
	a.insertFree(a.newNode(0, usable)) // firstNode
	return a, nil
}

// Alloc reserves n bytes (rounded up to the alignment) and returns their
// offset. It returns ok=false, changing nothing, for n == 0, for n larger
// than the segment, and when no free block fits. Among the blocks of the
// request's own size class it takes the best fit of the first few (an exact
// fit stops the search), otherwise the first block of the smallest class
// whose every block fits, and splits off the tail. So Alloc may fail while
// LargestFree() >= n only when every block that fits is less than 1/16
// larger than the request and lies deep in its class's list.
func (a *Allocator) Alloc(n uint64) (off uint64, ok bool) {
	if n == 0 || n > a.size {
		a.failed++
		return 0, false
	}
	size := (n + a.align - 1) &^ (a.align - 1) // no overflow: n <= size, a multiple of align
	idx := a.find(size)
	if idx == 0 {
		a.failed++
		return 0, false
	}
	a.unlinkFree(idx)
	if rest := a.nodes[idx].size - size; rest > 0 {
		// The tail stays free. newNode may grow the slice: index, don't hold pointers.
		t := a.newNode(a.nodes[idx].off+size, rest)
		next := a.nodes[idx].next
		a.nodes[t].prev, a.nodes[t].next = idx, next
		if next != 0 {
			a.nodes[next].prev = t
		}
		a.nodes[idx].next, a.nodes[idx].size = t, size
		a.insertFree(t)
	}
	off = a.nodes[idx].off
	a.live[off] = idx
	a.used += size
	a.allocs++
	return off, true
}

// find returns a free block of at least size bytes, or 0.
func (a *Allocator) find(size uint64) uint32 {
	g := size >> a.shift
	c := classOf(g)
	// The own class mixes blocks smaller and larger than the request: look at
	// its first few for the tightest fit. Equal-size KV blocks land here and
	// reuse holes of exactly their size instead of splitting larger blocks.
	best, bestSize := uint32(0), ^uint64(0)
	for i, k := a.heads[c], 0; i != 0 && k < fitScan; i, k = a.nodes[i].nextFree, k+1 {
		if s := a.nodes[i].size; s >= size && s < bestSize {
			best, bestSize = i, s
			if s == size {
				break
			}
		}
	}
	if best != 0 {
		return best
	}
	// Every block of a class above fits.
	if c+1 >= numClasses {
		return 0
	}
	if c = a.nonEmptyFrom(c + 1); c < 0 {
		return 0
	}
	return a.heads[c]
}

// nonEmptyFrom returns the smallest non-empty class >= c, or -1.
func (a *Allocator) nonEmptyFrom(c int) int {
	grp := c >> classBits
	m := a.classMap[grp] & (^uint16(0) << (c & (classesPerGroup - 1)))
	if m == 0 {
		gm := a.groupMap & (^uint64(0) << (grp + 1))
		if gm == 0 {
			return -1
		}
		grp = bits.TrailingZeros64(gm)
		m = a.classMap[grp]
	}
	return grp<<classBits | bits.TrailingZeros16(m)
}

// Free releases the allocation at off and merges it with free neighbours.
// An offset that is not a live allocation returns ErrNotAllocated and
// changes nothing.
func (a *Allocator) Free(off uint64) error {
	idx, ok := a.live[off]
	if !ok {
		return fmt.Errorf("%w: %#x", ErrNotAllocated, off)
	}
	delete(a.live, off)
	a.used -= a.nodes[idx].size
	a.frees++
	// Merging keeps the lower node, so firstNode survives.
	if p := a.nodes[idx].prev; p != 0 && a.nodes[p].free {
		a.unlinkFree(p)
		a.absorbNext(p)
		idx = p
	}
	if nx := a.nodes[idx].next; nx != 0 && a.nodes[nx].free {
		a.unlinkFree(nx)
		a.absorbNext(idx)
	}
	a.insertFree(idx)
	return nil
}

// absorbNext merges the block after idx into idx and recycles its node.
func (a *Allocator) absorbNext(idx uint32) {
	b := &a.nodes[idx]
	nx := b.next
	n := &a.nodes[nx]
	b.size += n.size
	b.next = n.next
	if n.next != 0 {
		a.nodes[n.next].prev = idx
	}
	*n = node{nextFree: a.spare}
	a.spare = nx
}

// Size returns the bytes under management: the size given to New
// rounded down to the alignment.
func (a *Allocator) Size() uint64 { return a.size }

// Used returns the bytes allocated, each allocation rounded up to the
// alignment.
func (a *Allocator) Used() uint64 { return a.used }

// FreeBytes returns Size() - Used(), possibly in several blocks.
func (a *Allocator) FreeBytes() uint64 { return a.size - a.used }

// Alignment returns the alignment of offsets and granule of sizes.
func (a *Allocator) Alignment() uint64 { return a.align }

// SizeOf returns the (rounded) size of the live allocation at off.
func (a *Allocator) SizeOf(off uint64) (uint64, bool) {
	idx, ok := a.live[off]
	if !ok {
		return 0, false
	}
	return a.nodes[idx].size, true
}

// LargestFree returns the size of the largest free block, 0 when full. It
// walks the list of the highest non-empty class, which holds only the
// largest blocks.
func (a *Allocator) LargestFree() uint64 {
	if a.groupMap == 0 {
		return 0
	}
	grp := 63 - bits.LeadingZeros64(a.groupMap)
	c := grp<<classBits | (15 - bits.LeadingZeros16(a.classMap[grp]))
	var largest uint64
	for i := a.heads[c]; i != 0; i = a.nodes[i].nextFree {
		largest = max(largest, a.nodes[i].size)
	}
	return largest
}

// Stats is a snapshot of an Allocator.
type Stats struct {
	Size        uint64 // bytes under management
	Used        uint64 // bytes allocated, rounded to the alignment
	Free        uint64 // Size - Used
	LargestFree uint64 // largest free block
	Alignment   uint64
	LiveBlocks  int    // live allocations
	FreeBlocks  int    // free blocks; never two adjacent
	Allocs      uint64 // successful Alloc calls, cumulative
	Frees       uint64 // successful Free calls, cumulative
	Failed      uint64 // failed Alloc calls, cumulative
}

// Fragmentation returns 1 - LargestFree/Free: 0 when the free space is one
// block (or there is none), near 1 when it is scattered in small pieces.
func (s Stats) Fragmentation() float64 {
	if s.Free == 0 {
		return 0
	}
	return 1 - float64(s.LargestFree)/float64(s.Free)
}

// Stats returns a snapshot of the allocator's state and counters.
func (a *Allocator) Stats() Stats {
	return Stats{
		Size:        a.size,
		Used:        a.used,
		Free:        a.size - a.used,
		LargestFree: a.LargestFree(),
		Alignment:   a.align,
		LiveBlocks:  len(a.live),
		FreeBlocks:  a.freeBlocks,
		Allocs:      a.allocs,
		Frees:       a.frees,
		Failed:      a.failed,
	}
}

// newNode returns a node for [off, off+size), recycled if possible.
func (a *Allocator) newNode(off, size uint64) uint32 {
	idx := a.spare
	if idx != 0 {
		a.spare = a.nodes[idx].nextFree
	} else {
		// At most 2·live+1 nodes exist; 2^32 of them would need 160 GiB.
		idx = uint32(len(a.nodes))
		a.nodes = append(a.nodes, node{})
	}
	a.nodes[idx] = node{off: off, size: size}
	return idx
}

// insertFree pushes idx on its class's list (LIFO: a just-freed hole is the
// first reused, which keeps the live set compact).
func (a *Allocator) insertFree(idx uint32) {
	b := &a.nodes[idx]
	c := classOf(b.size >> a.shift)
	b.free, b.prevFree, b.nextFree = true, 0, a.heads[c]
	if h := a.heads[c]; h != 0 {
		a.nodes[h].prevFree = idx
	}
	a.heads[c] = idx
	grp := c >> classBits
	a.classMap[grp] |= 1 << (c & (classesPerGroup - 1))
	a.groupMap |= 1 << grp
	a.freeBlocks++
}

// unlinkFree takes the free block idx off its class's list.
func (a *Allocator) unlinkFree(idx uint32) {
	b := &a.nodes[idx]
	c := classOf(b.size >> a.shift)
	if b.prevFree != 0 {
		a.nodes[b.prevFree].nextFree = b.nextFree
	} else {
		a.heads[c] = b.nextFree
	}
	if b.nextFree != 0 {
		a.nodes[b.nextFree].prevFree = b.prevFree
	}
	b.free, b.prevFree, b.nextFree = false, 0, 0
	if a.heads[c] == 0 {
		grp := c >> classBits
		a.classMap[grp] &^= 1 << (c & (classesPerGroup - 1))
		if a.classMap[grp] == 0 {
			a.groupMap &^= 1 << grp
		}
	}
	a.freeBlocks--
}

// classOf returns the class of a block of g granules (g > 0): the largest
// class whose lower bound is <= g.
func classOf(g uint64) int {
	if g < classesPerGroup {
		return int(g)
	}
	e := bits.Len64(g) - 1 - classBits
	return (e+1)<<classBits | int(g>>e)&(classesPerGroup-1)
}

// classLow returns the smallest granule count in class c.
func classLow(c int) uint64 {
	grp, m := c>>classBits, uint64(c&(classesPerGroup-1))
	if grp == 0 {
		return m
	}
	return (classesPerGroup + m) << (grp - 1)
}
