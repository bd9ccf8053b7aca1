package conductor

import (
	"fmt"
	"math/bits"
)

// Index is a global prefix index: for every block hash, which holders (the
// prefill instances' local caches, the store) have the block, with each
// holder's blocks kept in LRU order under a capacity. It answers the one
// question prefill scheduling asks, how long a leading run of a prompt's
// blocks each holder has, in one pass over the prompt whatever the number
// of holders: every block maps to a bit set of holders, and the pass ANDs
// them until no holder is left.
//
// Blocks are chained hashes (HashTokens, the traces' hash_ids), so a block
// stands for its whole prefix and a holder can serve only a leading run.
// Insert touches a request's blocks last to first, so the first block is
// the most recently used: eviction takes a prefix's tail before its head,
// as a radix-tree cache would, and never leaves an unreachable suffix
// behind a hole it could have avoided.
//
// An Index is not safe for concurrent use; the Scheduler guards its own.
type Index struct {
	blocks  map[uint64]*entry
	holders []*holder // by slot; nil for a free slot
	byName  map[string]int
	free    []int
	spare   *node // recycled list nodes, linked through next
	// spareEntries are recycled entries: n zero, key stale.
	spareEntries []*entry
	alive        []uint64
	// found are the entries of the blocks the last prefixes pass looked
	// up, by position, for the insert that follows it to skip the lookups.
	found []*entry
}

// inlineWords is the number of holder-set words an entry carries without
// an allocation: 128 holders, the store and 127 prefill instances.
const inlineWords = 2

// entry is one block: the set of holder slots that have it, and their
// list nodes. One map lookup finds both, so that the scheduler's pass
// over a prompt and its insertion into a cache cost one lookup per block
// each, whatever the holders.
type entry struct {
	key   uint64
	words [inlineWords]uint64
	more  []uint64 // slots from 64*inlineWords on
	nodes *node    // one per holder, linked through sib, the last found first
	n     int32    // number of holders
}

func (e *entry) word(w int) uint64 {
	if w < inlineWords {
		return e.words[w]
	}
	if w -= inlineWords; w < len(e.more) {
		return e.more[w]
	}
	return 0
}

func (e *entry) has(slot int) bool { return e.word(slot/64)&(1<<(slot%64)) != 0 }

func (e *entry) set(slot int) {
	w, b := slot/64, uint64(1)<<(slot%64)
	if w < inlineWords {
		e.words[w] |= b
		return
	}
	w -= inlineWords
	for len(e.more) <= w {
		e.more = append(e.more, 0)
	}
	e.more[w] |= b
}

func (e *entry) clear(slot int) {
	w, b := slot/64, uint64(1)<<(slot%64)
	if w < inlineWords {
		e.words[w] &^= b
	} else if w -= inlineWords; w < len(e.more) {
		e.more[w] &^= b
	}
}

// find returns slot's node of the block, moved to the front of the
// block's nodes (the instance that used a block is the likeliest to use
// it again), or nil when the slot does not have the block.
func (e *entry) find(slot int) *node {
	if !e.has(slot) {
		return nil
	}
	for p := &e.nodes; *p != nil; p = &(*p).sib {
		if n := *p; n.slot == slot {
			if p != &e.nodes {
				*p = n.sib
				n.sib, e.nodes = e.nodes, n
			}
			return n
		}
	}
	return nil
}

// holder is one cache: its blocks in an LRU list, most recent at the head.
type holder struct {
	name     string
	capacity int  // blocks; 0: unbounded
	len      int  // blocks held
	head     node // sentinel: head.next is the most recent, head.prev the least
}

// node is one block of one holder: in the holder's LRU list (prev, next)
// and among the block's holders (sib).
type node struct {
	e               *entry
	key             uint64
	slot            int
	prev, next, sib *node
}

// NewIndex returns an empty index without holders.
func NewIndex() *Index {
	return &Index{blocks: make(map[uint64]*entry), byName: make(map[string]int)}
}

// AddHolder registers a cache named name that keeps at most capacity
// blocks (0: unbounded, when the holder's own events bound it). Names are
// unique.
func (x *Index) AddHolder(name string, capacity int) error {
	if _, ok := x.byName[name]; ok {
		return fmt.Errorf("%w: holder %q", ErrDuplicate, name)
	}
	if capacity < 0 {
		return fmt.Errorf("%w: holder %q: negative capacity %d", ErrInvalid, name, capacity)
	}
	h := &holder{name: name, capacity: capacity}
	h.head.next, h.head.prev = &h.head, &h.head
	slot := len(x.holders)
	if n := len(x.free); n > 0 {
		slot, x.free = x.free[n-1], x.free[:n-1]
		x.holders[slot] = h
	} else {
		x.holders = append(x.holders, h)
	}
	x.byName[name] = slot
	return nil
}

// RemoveHolder forgets a holder and every block it held; false if there
// was none of that name.
func (x *Index) RemoveHolder(name string) bool {
	slot, ok := x.byName[name]
	if !ok {
		return false
	}
	h := x.holders[slot]
	for n := h.head.next; n != &h.head; {
		next := n.next
		x.drop(n)
		n = next
	}
	x.holders[slot] = nil
	x.free = append(x.free, slot)
	delete(x.byName, name)
	return true
}

// Insert records that the named holder has blocks, most recently used;
// blocks it lacks are added, evicting its least recently used ones beyond
// its capacity. An unknown holder is ignored.
func (x *Index) Insert(name string, blocks []uint64) {
	if slot, ok := x.byName[name]; ok {
		x.insert(slot, blocks, nil)
	}
}

// insert is Insert into slot. found[i], where there is one, is the entry
// of blocks[i] as of a lookup since which the index has not changed (the
// prefixes pass of the same decision); an entry the insertion itself
// empties has left the index (n zero, or recycled for another key since)
// and is looked up again.
func (x *Index) insert(slot int, blocks []uint64, found []*entry) {
	h := x.holders[slot]
	// Last to first: the head of the prefix ends up the most recent.
	for i := len(blocks) - 1; i >= 0; i-- {
		k := blocks[i]
		var e *entry
		if i < len(found) {
			e = found[i]
		}
		if e == nil || e.n == 0 || e.key != k {
			e = x.blocks[k]
		}
		if e == nil {
			e = x.entry(k)
			x.blocks[k] = e
		} else if n := e.find(slot); n != nil {
			h.moveFront(n)
			continue
		}
		n := x.node()
		n.e, n.key, n.slot = e, k, slot
		n.sib, e.nodes = e.nodes, n
		e.set(slot)
		e.n++
		h.pushFront(n)
		h.len++
		if h.capacity > 0 && h.len > h.capacity {
			// Not n: it is at the front, and the capacity is at least 1.
			x.drop(h.head.prev)
		}
	}
}

// Delete records that the named holder no longer has blocks (evicted,
// freed). Blocks it did not have and unknown holders are ignored.
func (x *Index) Delete(name string, blocks []uint64) {
	slot, ok := x.byName[name]
	if !ok {
		return
	}
	for _, k := range blocks {
		if e := x.blocks[k]; e != nil {
			if n := e.find(slot); n != nil {
				x.drop(n)
			}
		}
	}
}

// drop takes node n out of its holder and its block, and the block out of
// the index when n was its last holder.
func (x *Index) drop(n *node) {
	x.holders[n.slot].unlink(n)
	x.holders[n.slot].len--
	e := n.e
	for p := &e.nodes; *p != nil; p = &(*p).sib {
		if *p == n {
			*p = n.sib
			break
		}
	}
	e.clear(n.slot)
	if e.n--; e.n <= 0 {
		delete(x.blocks, n.key)
		x.recycleEntry(e)
	}
	x.recycle(n)
}

// Longest returns, for every holder with at least the first block, the
// number of leading blocks it holds. Holders without are absent.
func (x *Index) Longest(blocks []uint64) map[string]int {
	lens := x.prefixes(blocks, nil)
	x.forget()
	out := make(map[string]int)
	for slot, n := range lens {
		if n > 0 && x.holders[slot] != nil {
			out[x.holders[slot].name] = n
		}
	}
	return out
}

// Prefix is the number of leading blocks the named holder has.
func (x *Index) Prefix(name string, blocks []uint64) int {
	slot, ok := x.byName[name]
	if !ok {
		return 0
	}
	for i, k := range blocks {
		if e := x.blocks[k]; e == nil || !e.has(slot) {
			return i
		}
	}
	return len(blocks)
}

// prefixes sets lens[slot] to the leading run of blocks each holder slot
// has, reusing lens when it is large enough, and returns it. One map
// lookup per block until no holder is left; x.found keeps what they
// found.
func (x *Index) prefixes(blocks []uint64, lens []int) []int {
	if cap(lens) < len(x.holders) {
		lens = make([]int, len(x.holders))
	}
	lens = lens[:len(x.holders)]
	words := (len(x.holders) + 63) / 64
	if cap(x.alive) < words {
		x.alive = make([]uint64, words)
	}
	alive := x.alive[:words]
	clear(alive)
	for slot, h := range x.holders {
		lens[slot] = 0
		if h != nil {
			alive[slot/64] |= 1 << (slot % 64)
		}
	}
	left := len(x.holders) - len(x.free)
	x.found = x.found[:0]
	for i, k := range blocks {
		if left == 0 {
			return lens
		}
		e := x.blocks[k]
		x.found = append(x.found, e)
		for w := range alive {
			var have uint64
			if e != nil {
				have = e.word(w)
			}
			gone := alive[w] &^ have
			for gone != 0 {
				b := bits.TrailingZeros64(gone)
				gone &^= 1 << b
				lens[w*64+b] = i
				left--
			}
			alive[w] &= have
		}
	}
	for w, a := range alive {
		for a != 0 {
			b := bits.TrailingZeros64(a)
			a &^= 1 << b
			lens[w*64+b] = len(blocks)
		}
	}
	return lens
}

// forget drops the entries the last prefixes pass found, which an
// insertion will not use: entries that leave the index are not kept
// alive by them.
func (x *Index) forget() {
	clear(x.found)
	x.found = x.found[:0]
}

// Holders is the number of holders that have block k: its replicas.
func (x *Index) Holders(k uint64) int {
	if e := x.blocks[k]; e != nil {
		return int(e.n)
	}
	return 0
}

// Has reports whether the named holder has block k.
func (x *Index) Has(name string, k uint64) bool {
	slot, ok := x.byName[name]
	if !ok {
		return false
	}
	e := x.blocks[k]
	return e != nil && e.has(slot)
}

// Len is the number of blocks the named holder has.
func (x *Index) Len(name string) int {
	if slot, ok := x.byName[name]; ok {
		return x.holders[slot].len
	}
	return 0
}

// Blocks is the number of distinct blocks some holder has.
func (x *Index) Blocks() int { return len(x.blocks) }

func (x *Index) node() *node {
	n := x.spare
	if n == nil {
		return &node{}
	}
	x.spare = n.next
	n.next = nil
	return n
}

func (x *Index) entry(k uint64) *entry {
	n := len(x.spareEntries)
	if n == 0 {
		return &entry{key: k}
	}
	e := x.spareEntries[n-1]
	x.spareEntries[n-1] = nil
	x.spareEntries = x.spareEntries[:n-1]
	e.key = k
	return e
}

// spareEntriesMax bounds the recycled entries kept: enough for the churn of
// decisions, not the aftermath of a mass eviction.
const spareEntriesMax = 1 << 12

func (x *Index) recycleEntry(e *entry) {
	if len(x.spareEntries) >= spareEntriesMax {
		return
	}
	more := e.more
	clear(more)
	*e = entry{more: more[:0]}
	x.spareEntries = append(x.spareEntries, e)
}

func (x *Index) recycle(n *node) {
	*n = node{next: x.spare}
	x.spare = n
}

func (h *holder) pushFront(n *node) {
	n.prev, n.next = &h.head, h.head.next
	h.head.next.prev = n
	h.head.next = n
}

func (h *holder) unlink(n *node) {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (h *holder) moveFront(n *node) {
	if h.head.next == n {
		return
	}
	h.unlink(n)
	h.pushFront(n)
}
