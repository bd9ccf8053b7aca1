package master

import "time"

// The eviction order. Each shard keeps the objects a DRAM eviction may take
// in min-heaps by lease time, one per class:
//
//   - plain: evictable once its lease ends;
//   - soft: the same, with a soft pin running: a second pass takes it;
//   - moving, movingSoft: the same with a move (spill, offload) in flight:
//     only a forced eviction takes them.
//
// Objects an eviction never takes are in no heap: no readable value, a put
// in flight, hard-pinned, or only on SSD. An object changes heap when it
// changes (reorderLocked, O(log n) in its shard's objects), so an eviction
// finds the oldest objects of a class at the heads of the shards' heaps and
// walks only what it takes: a leased head ends its heap's walk (every
// object behind it has a later lease), and pinned objects or puts in flight
// are not there to skip. Soft pins end with time, not with a change: each
// shard also keeps its soft-pinned objects by the pin's end, and an
// eviction first moves the objects whose pins ended into plain (or moving).

// Eviction classes: the bits of a heap's index, plus one.
const (
	classNone   = 0
	classSoft   = 1 // a soft pin runs
	classMoving = 2 // a move is in flight
	numClasses  = 4
)

// orderNode is an object's place in its shard's eviction order.
type orderNode struct {
	key    string // the object's key, for the eviction that takes it
	lease  int64  // stamp(o.lease) when placed: the heap key
	pinEnd int64  // stamp(o.softPinUntil) when placed in pins
	class  int8   // 1 + the index of the heap it is in; classNone: none
	idx    int32  // where in that heap
	pinIdx int32  // where in pins; -1 or pinned false: not there
	pinned bool
}

// evictOrder is a shard's eviction order, under the shard's lock.
type evictOrder struct {
	byLease [numClasses]objHeap
	pins    objHeap // the soft-pinned objects, by the end of their pins
}

// classOf is the heap o belongs in at now (1 + its index), or classNone.
// The checks are evictable's: a head that fails evictable is leased, which
// ends the walk of its heap.
func classOf(o *object, now func() time.Time) int8 {
	if !o.complete() || o.pending != nil || o.hardPin || o.replicas[0].onDisk() {
		return classNone
	}
	var c int8
	if !o.softPinUntil.IsZero() && o.softPinUntil.After(now()) {
		c |= classSoft
	}
	if o.moving != nil {
		c |= classMoving
	}
	return c + 1
}

// clockEpoch is the origin of stamp.
var clockEpoch = time.Now()

// stamp is t as a heap key, in nanoseconds from clockEpoch. Leases are
// compared with time.Time.After, which uses the monotonic clock when both
// times have its reading (those of time.Now), else the wall clock; Sub
// does the same, so a key orders as After does. A wall-clock key
// (UnixNano) would not: after a step of the wall clock back, a lease
// granted since would sort before older ones that have ended, and head a
// heap while still running, which ends an eviction's walk of that heap.
func stamp(t time.Time) int64 { return int64(t.Sub(clockEpoch)) }

// reorderLocked puts o, key's object, where it now belongs in sh's eviction
// order, or takes it out when no eviction may take it; an object taken out
// of sh's map has no replicas, so it leaves the order too. Every change to
// what classOf or the order reads (replicas, put in flight, pins, move,
// lease) calls it. sh.mu is held.
func (s *Service) reorderLocked(sh *shard, key string, o *object) {
	sh.order.place(o, key, classOf(o, s.now))
}

// place moves o to heap c (classNone: out of the order), keyed by its
// current lease, and into or out of pins.
func (e *evictOrder) place(o *object, key string, c int8) {
	n := &o.ev
	e.pins.pin = true
	lease := stamp(o.lease)
	switch {
	case n.class == c && (c == classNone || n.lease == lease):
	case n.class == c:
		n.lease = lease
		e.byLease[c-1].rekey(int(n.idx), lease)
	default:
		if n.class != classNone {
			e.byLease[n.class-1].remove(int(n.idx))
		}
		n.class, n.key, n.lease = c, key, lease
		if c != classNone {
			e.byLease[c-1].push(o, lease)
		} else {
			n.key = ""
		}
	}
	pinned := c != classNone && (c-1)&classSoft != 0
	switch pinEnd := stamp(o.softPinUntil); {
	case pinned && !n.pinned:
		n.pinned, n.pinEnd = true, pinEnd
		e.pins.push(o, pinEnd)
	case pinned && n.pinEnd != pinEnd:
		n.pinEnd = pinEnd
		e.pins.rekey(int(n.pinIdx), pinEnd)
	case !pinned && n.pinned:
		e.pins.remove(int(n.pinIdx))
		n.pinned = false
	}
}

// unpinExpired moves the soft-pinned objects whose pins ended by now out of
// the soft classes. sh.mu is held.
func (s *Service) unpinExpired(sh *shard, now time.Time) {
	at := func() time.Time { return now }
	for len(sh.order.pins.a) > 0 {
		o := sh.order.pins.a[0].o
		if o.softPinUntil.After(now) {
			return
		}
		sh.order.place(o, o.ev.key, classOf(o, at))
	}
}

// head is the oldest object of heap c (1 + index), or nil.
func (e *evictOrder) head(c int8) *object {
	if h := &e.byLease[c-1]; len(h.a) > 0 {
		return h.a[0].o
	}
	return nil
}

// clear empties the order, for a shard whose objects are replaced.
func (e *evictOrder) clear() {
	for i := range e.byLease {
		clear(e.byLease[i].a)
		e.byLease[i].a = nil
	}
	clear(e.pins.a)
	e.pins.a = nil
}

// objHeap is a 4-ary min-heap of objects by orderNode.lease (or pinEnd
// for pins), each object knowing its index (idx, or pinIdx), so a changed
// or removed object is fixed in O(log n). The keys sit beside the pointers,
// so a sift compares within the array and touches only the objects it
// moves; four children a node halve the levels, each a cache miss on the
// object moved, that a binary heap would take.
type objHeap struct {
	a   []heapEntry
	pin bool // keyed by pinEnd, indexed by pinIdx
}

type heapEntry struct {
	key int64
	o   *object
}

func (h *objHeap) set(i int) {
	if h.pin {
		h.a[i].o.ev.pinIdx = int32(i)
	} else {
		h.a[i].o.ev.idx = int32(i)
	}
}

func (h *objHeap) swap(i, j int) {
	h.a[i], h.a[j] = h.a[j], h.a[i]
	h.set(i)
	h.set(j)
}

// push adds o at key.
func (h *objHeap) push(o *object, key int64) {
	h.a = append(h.a, heapEntry{key, o})
	h.set(len(h.a) - 1)
	h.up(len(h.a) - 1)
}

func (h *objHeap) remove(i int) {
	last := len(h.a) - 1
	if i != last {
		h.swap(i, last)
	}
	h.a[last] = heapEntry{}
	h.a = h.a[:last]
	if i != last {
		h.fix(i)
	}
	if cap(h.a) > 256 && len(h.a) < cap(h.a)/4 {
		h.a = append([]heapEntry(nil), h.a...) // a pool that emptied
	}
}

// rekey moves the entry at i to key.
func (h *objHeap) rekey(i int, key int64) {
	h.a[i].key = key
	h.fix(i)
}

func (h *objHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

const heapArity = 4

func (h *objHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / heapArity
		if h.a[p].key <= h.a[i].key {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts i down and reports whether it moved.
func (h *objHeap) down(i int) bool {
	i0, n := i, len(h.a)
	for {
		first := heapArity*i + 1
		if first >= n {
			break
		}
		m := first
		for c := first + 1; c < min(first+heapArity, n); c++ {
			if h.a[c].key < h.a[m].key {
				m = c
			}
		}
		if h.a[i].key <= h.a[m].key {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > i0
}
