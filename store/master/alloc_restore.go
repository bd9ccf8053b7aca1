package master

import (
	"cmp"
	"fmt"
	"slices"
)

// span is an allocated range [off, off+size) of a segment.
type span struct{ off, size uint64 }

// restoreAllocator returns an allocator of size bytes in which exactly the
// given spans are allocated, as a new leader rebuilds the segments of the
// journal it loaded. Spans are sizes as asked (rounded up here, as Alloc
// rounds them); they must be aligned, inside the segment and disjoint.
func restoreAllocator(size uint64, used []span) (*Allocator, error) {
	a, err := NewAllocator(size)
	if err != nil {
		return nil, err
	}
	if len(used) == 0 {
		return a, nil
	}
	used = slices.Clone(used)
	slices.SortFunc(used, func(x, y span) int { return cmp.Compare(x.off, y.off) })
	// Start over from no blocks: node 1 (firstNode) is rebuilt below as
	// the block at offset 0, free or not.
	a.unlinkFree(firstNode)
	a.nodes = a.nodes[:1]
	prev := uint32(0)
	link := func(off, n uint64, free bool) {
		idx := a.newNode(off, n)
		a.nodes[idx].prev = prev
		if prev != 0 {
			a.nodes[prev].next = idx
		}
		prev = idx
		if free {
			a.insertFree(idx)
			return
		}
		a.live[off] = idx
		a.used += n
	}
	cursor := uint64(0)
	for _, s := range used {
		n := (s.size + a.align - 1) &^ (a.align - 1)
		switch {
		case s.size == 0 || s.off%a.align != 0:
			return nil, fmt.Errorf("master: restore span %#x+%d: not an allocation", s.off, s.size)
		case s.off < cursor:
			return nil, fmt.Errorf("master: restore span %#x+%d overlaps the one before", s.off, s.size)
		case s.off+n > a.size || s.off+n < s.off:
			return nil, fmt.Errorf("master: restore span %#x+%d is outside the segment of %d", s.off, s.size, a.size)
		}
		if s.off > cursor {
			link(cursor, s.off-cursor, true)
		}
		link(s.off, n, false)
		cursor = s.off + n
	}
	if cursor < a.size {
		link(cursor, a.size-cursor, true)
	}
	return a, nil
}
