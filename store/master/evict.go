package master

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// candidate is an object an SSD tier's or a tenant's eviction may take.
type candidate struct {
	sh    *shard
	key   string
	o     *object
	lease int64 // stamp(o.lease): the eviction order
	soft  bool
}

// Evict frees space when the pool is above EvictionHighWatermark, or after
// a failed allocation asked for it: at least EvictionRatio of capacity
// (more if usage is further above the watermark), near-LRU by lease time,
// oldest first. It never takes objects with an active lease, hard-pinned
// objects or objects with a put in flight; a first pass skips soft-pinned
// objects whose pin is still running, a second may take them. It returns
// the bytes freed. It also frees replaced values whose leases have ended.
//
// It costs O(shards) plus O(log n) per object it takes, whatever the pool
// holds: each shard keeps the objects it may take in order of lease
// (evict_order.go), and the objects it never takes are not in that order.
func (s *Service) Evict() uint64 {
	return s.evict(s.needEvict.Swap(false))
}

func (s *Service) evict(force bool) uint64 {
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	return s.evictLockedAll(force)
}

// startEvicting is tryStart for a put that found no room: it evicts and
// tries again until the put fits, nothing is left to evict, or it has
// evicted a pool's worth (puts that need no eviction kept taking the room).
// Evictions run one at a time (two would each free the target), and the put
// allocates before it lets the next one in, so puts waiting to evict do not
// take each other's room: the first thing a put does once in is try again,
// in the room the eviction before it made.
func (s *Service) startEvicting(ctx context.Context, clientID, key string, length uint64, n int, cfg *storepb.ReplicateConfig, upsert bool) ([]replica, uint64, error) {
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	for range int(1/max(s.cfg.EvictionRatio, 0.01)) + 2 {
		reps, seq, err := s.tryStart(clientID, key, length, n, cfg, upsert)
		if err != errNoSpace {
			return reps, seq, err
		}
		if s.evictLockedAll(true) == 0 {
			return nil, 0, errNoSpace
		}
		if s.j != nil {
			// Evicted space comes back once the drops are durable. A
			// journal that failed fails the put's own record; a caller
			// gone ends the put here.
			if err := s.durable(ctx, s.j.last()); err != nil && ctx.Err() != nil {
				return nil, 0, err
			}
		}
	}
	return nil, 0, errNoSpace
}

// evictLockedAll is evict with evictMu held.
func (s *Service) evictLockedAll(force bool) (freed uint64) {
	now := s.now()
	s.evictDisk(now)
	s.segMu.Lock()
	kept := s.deferred[:0]
	for _, d := range s.deferred {
		if d.at.After(now) {
			kept = append(kept, d)
		} else {
			s.freeLocked(d.reps)
		}
	}
	clear(s.deferred[len(kept):])
	s.deferred = kept
	capacity, used := s.usageLocked(storepb.Medium_MEDIUM_DRAM)
	used -= min(used, s.spilling+s.freeing.Load()) // on their way out
	s.segMu.Unlock()
	if capacity == 0 {
		return 0
	}
	high := s.cfg.EvictionHighWatermark * float64(capacity)
	if float64(used) <= high && !force {
		return 0
	}
	// An attempt, for master_attempted_evictions_total; a successful one
	// freed something.
	s.evictAttempts.Add(1)
	defer func() {
		if freed > 0 {
			s.evictSuccesses.Add(1)
		}
	}()
	ratio := s.cfg.EvictionRatio * float64(capacity)
	target := max(ratio, float64(used)-high+ratio)
	// The first pass leaves objects with a soft pin running, the second
	// takes them.
	for _, soft := range []bool{false, true} {
		if freed += s.evictPass(now, force, soft, target-float64(freed)); float64(freed) >= target {
			break
		}
	}
	return freed
}

// evictPass evicts the oldest objects of the soft-pinned classes (soft) or
// of the others until want bytes are freed or none is left that may go:
// a merge of the shards' heaps (evict_order.go) by lease, each walked from
// its head until the head is leased. It costs O(shards) to start and
// O(log n) per object it takes. evictMu is held.
func (s *Service) evictPass(now time.Time, force, soft bool, want float64) uint64 {
	classes := []int8{1, 1 + classMoving}[:1+b2i(force)]
	if soft {
		classes = []int8{1 + classSoft, 1 + classSoft + classMoving}[:1+b2i(force)]
	}
	hs := s.evictHeads[:0]
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if !soft {
			s.unpinExpired(sh, now)
		}
		for _, c := range classes {
			if o := sh.order.head(c); o != nil && !o.lease.After(now) {
				hs = append(hs, orderHead{sh: sh, class: c, lease: o.ev.lease})
			}
		}
		sh.mu.Unlock()
	}
	heads := headHeap(hs)
	heads.init()
	defer func() {
		clear(hs)
		s.evictHeads = hs[:0]
	}()
	var freed uint64
	for float64(freed) < want && len(heads) > 0 {
		h := &heads[0]
		sh := h.sh
		sh.mu.Lock()
		o := sh.order.head(h.class)
		switch {
		case o == nil:
			heads.pop()
		case o.ev.lease > h.lease:
			// Taken, or leased again, since: this heap's turn comes
			// at its new head's lease.
			h.lease = o.ev.lease
			heads.down(0)
		case o.lease.After(now):
			s.evictVisited++
			heads.pop() // leased, and every object behind it too
		default:
			s.evictVisited++
			key := o.ev.key
			if evictable(o, now, force) && (soft || !o.softPinUntil.After(now)) {
				freed += s.evictLocked(sh, key, o, force)
			}
			// Taking o moved it out of h's heap; one not evictable, a
			// change that missed its reorder, is put where it belongs.
			s.reorderLocked(sh, key, o)
			switch n := sh.order.head(h.class); {
			case n == nil || n == o: // o staying cannot happen; a walk must end
				heads.pop()
			default:
				h.lease = n.ev.lease
				heads.down(0)
			}
		}
		sh.mu.Unlock()
	}
	return freed
}

// orderHead is a shard's heap of one class in the merge of an eviction
// pass, at the lease of its head when last looked at.
type orderHead struct {
	sh    *shard
	class int8
	lease int64
}

// headHeap is a min-heap of orderHeads by lease.
type headHeap []orderHead

func (h headHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *headHeap) pop() {
	last := len(*h) - 1
	(*h)[0] = (*h)[last]
	(*h)[last] = orderHead{}
	*h = (*h)[:last]
	h.down(0)
}

func (h headHeap) down(i int) {
	for {
		m, l := i, 2*i+1
		if l < len(h) && h[l].lease < h[m].lease {
			m = l
		}
		if r := l + 1; r < len(h) && h[r].lease < h[m].lease {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func evictable(o *object, now time.Time, force bool) bool {
	return o.complete() && o.pending == nil && (o.moving == nil || force) && !o.hardPin && !o.lease.After(now) &&
		!o.replicas[0].onDisk() // DRAM replicas come first
}

// dramBytes is what evicting o frees in DRAM, at most.
func dramBytes(o *object) uint64 { return bytesOn(o, false) }

// bytesOn is the size of o's replicas on SSD (disk) or in DRAM.
func bytesOn(o *object, disk bool) uint64 {
	var n uint64
	for _, r := range o.replicas {
		if r.onDisk() == disk {
			n += r.size
		}
	}
	return n
}

// candidateOrder is the objects an SSD tier's eviction may take (evictDisk),
// least recently leased first. Only the front expected to cover the
// eviction is sorted up front; the rest is sorted if a walk gets there. A
// pass over a pool of N objects thus costs a scan and O(N) selection
// instead of an O(N log N) sort. (DRAM evictions, which a put load runs
// back to back, walk the shards' eviction order instead: evictPass.)
type candidateOrder struct {
	buf    *[]candidate // where the buffer goes back
	c      []candidate
	sorted int // c[:sorted] are the smallest leases, in order
}

func (e *candidateOrder) len() int { return len(e.c) }

func (e *candidateOrder) at(i int) *candidate {
	if i >= e.sorted {
		slices.SortFunc(e.c[e.sorted:], byLease)
		e.sorted = len(e.c)
	}
	return &e.c[i]
}

// release hands the candidate buffer back for the next scan (evictMu is
// held), without the pointers it held.
func (e *candidateOrder) release() {
	clear(e.c)
	*e.buf = e.c[:0]
}

func byLease(a, b candidate) int { return cmp.Compare(a.lease, b.lease) }

// candidates lists the objects ok accepts in a candidateOrder whose sorted
// front is expected to free target bytes fronts times over (bytesOf tells
// what each frees). evictMu is held: the list reuses *buf.
func (s *Service) candidates(now time.Time, ok func(*object) bool, bytesOf func(*object) uint64, target float64,
	buf *[]candidate, fronts int) *candidateOrder {
	cands := (*buf)[:0]
	var total uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, o := range sh.objects {
			if ok(o) {
				total += bytesOf(o)
				cands = append(cands, candidate{sh: sh, key: key, o: o, lease: stamp(o.lease),
					soft: o.softPinUntil.After(now)})
			}
		}
		sh.mu.Unlock()
	}
	e := &candidateOrder{buf: buf, c: cands}
	if len(cands) == 0 {
		return e
	}
	// The objects of an average size fronts targets need, one target more
	// and some: rechecks fail and soft pins are skipped; a walk past the
	// front sorts the rest.
	avg := float64(total) / float64(len(cands))
	k := len(cands)
	if avg > 0 {
		k = min(len(cands), (fronts+1)*int(target/avg)+64)
	}
	if k < len(cands) {
		selectSmallest(cands, k)
	}
	slices.SortFunc(cands[:k], byLease)
	e.sorted = k
	return e
}

// selectSmallest reorders c so that c[:k] holds its k smallest leases (in
// no order): quickselect with a three-way partition, so equal leases (a
// coarse clock) cost no more than distinct ones.
func selectSmallest(c []candidate, k int) {
	lo, hi := 0, len(c) // the k-th smallest is within c[lo:hi]
	for hi-lo > 16 && lo < k && k < hi {
		p := medianOf3(c[lo].lease, c[lo+(hi-lo)/2].lease, c[hi-1].lease)
		// c[lo:lt] < p, c[lt:i] == p, c[gt:hi] > p.
		lt, i, gt := lo, lo, hi
		for i < gt {
			switch l := c[i].lease; {
			case l < p:
				c[lt], c[i] = c[i], c[lt]
				lt++
				i++
			case l > p:
				gt--
				c[i], c[gt] = c[gt], c[i]
			default:
				i++
			}
		}
		switch {
		case k < lt:
			hi = lt
		case k > gt:
			lo = gt
		default:
			return // the boundary falls among the leases equal to p
		}
	}
	if lo < hi {
		slices.SortFunc(c[lo:hi], byLease)
	}
}

func medianOf3(a, b, c int64) int64 {
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	return max(a, b)
}
