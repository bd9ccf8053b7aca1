package alloc

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// ErrBadSpan is the cause of a Restore refused: a span that is empty,
// unaligned, outside the segment or overlapping another.
var ErrBadSpan = errors.New("alloc: restore span")

// Span is an allocated range [Off, Off+Size) of a segment.
type Span struct{ Off, Size uint64 }

// Restore returns an allocator of size bytes (default alignment) in which
// exactly the given spans are allocated, as a new master leader rebuilds
// the segments of the journal it loaded. Spans are sizes as asked (rounded
// up here, as Alloc rounds them); they must be aligned, inside the segment
// and disjoint.
func Restore(size uint64, used []Span) (*Allocator, error) {
	a, err := New(size)
	if err != nil {
		return nil, err
	}
	if len(used) == 0 {
		return a, nil
	}
	used = slices.Clone(used)
	slices.SortFunc(used, func(x, y Span) int { return cmp.Compare(x.Off, y.Off) })
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
		if s.Size > a.size {
			// Rounded up, a size near 2^64 would wrap to a block of none.
			return nil, fmt.Errorf("%w %#x+%d: outside the segment of %d", ErrBadSpan, s.Off, s.Size, a.size)
		}
		n := (s.Size + a.align - 1) &^ (a.align - 1)
		switch {
		case s.Size == 0 || s.Off%a.align != 0:
			return nil, fmt.Errorf("%w %#x+%d: not an allocation", ErrBadSpan, s.Off, s.Size)
		case s.Off < cursor:
			return nil, fmt.Errorf("%w %#x+%d: overlaps the one before", ErrBadSpan, s.Off, s.Size)
		case s.Off+n > a.size || s.Off+n < s.Off:
			return nil, fmt.Errorf("%w %#x+%d: outside the segment of %d", ErrBadSpan, s.Off, s.Size, a.size)
		}
		if s.Off > cursor {
			link(cursor, s.Off-cursor, true)
		}
		link(s.Off, n, false)
		cursor = s.Off + n
	}
	if cursor < a.size {
		link(cursor, a.size-cursor, true)
	}
	return a, nil
}
