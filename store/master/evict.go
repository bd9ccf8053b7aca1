package master

import (
	"cmp"
	"slices"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// candidate is an object eviction may take.
type candidate struct {
	sh    *shard
	key   string
	o     *object
	lease int64 // o.lease in Unix nanoseconds: the eviction order
	bytes uint64
	soft  bool
}

// Evict frees space when the pool is above EvictionHighWatermark, or after
// a failed allocation asked for it: at least EvictionRatio of capacity
// (more if usage is further above the watermark), near-LRU by lease time,
// oldest first. It never takes objects with an active lease, hard-pinned
// objects or objects with a put in flight; a first pass skips soft-pinned
// objects whose pin is still running, a second may take them. It returns
// the bytes freed. It also frees replaced values whose leases have ended.
func (s *Service) Evict() uint64 {
	return s.evict(s.needEvict.Swap(false))
}

func (s *Service) evict(force bool) uint64 {
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	return s.evictLockedAll(force)
}

// evictForPut is the eviction of a put that found no room. Evictions run
// one at a time (two would each free the target); a put that waited while
// another put's eviction ran gets false, without evicting, and retries its
// allocation in the room that one made.
func (s *Service) evictForPut() (ran bool) {
	gen := s.putEvictions.Load()
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	if s.putEvictions.Load() != gen {
		return false
	}
	s.evictLockedAll(true)
	s.putEvictions.Add(1)
	return true
}

// evictLockedAll is evict with evictMu held.
func (s *Service) evictLockedAll(force bool) uint64 {
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
	ratio := s.cfg.EvictionRatio * float64(capacity)
	target := max(ratio, float64(used)-high+ratio)

	order := s.candidates(now, func(o *object) bool { return evictable(o, now, force) }, dramBytes, target)
	defer order.release()
	var freed uint64
	for pass := range 2 {
		for i := range order.len() {
			if float64(freed) >= target {
				return freed
			}
			c := order.at(i)
			if c.soft != (pass == 1) {
				continue
			}
			c.sh.mu.Lock()
			// Recheck: a reader may have leased it, or it may be gone.
			if c.sh.objects[c.key] == c.o && evictable(c.o, now, force) {
				freed += s.evictLocked(c.sh, c.key, c.o, force)
			}
			c.sh.mu.Unlock()
		}
	}
	return freed
}

func evictable(o *object, now time.Time, force bool) bool {
	return o.complete() && o.pending == nil && (o.moving == nil || force) && !o.hardPin && !o.lease.After(now) &&
		!o.replicas[0].onDisk() // DRAM replicas come first
}

// dramBytes is what evicting o frees in DRAM, at most.
func dramBytes(o *object) uint64 {
	var n uint64
	for _, r := range o.replicas {
		if !r.onDisk() {
			n += r.size
		}
	}
	return n
}

// evictOrder is the objects an eviction may take, least recently leased
// first. Only the front expected to cover the eviction's target is sorted
// up front; the rest is sorted if a walk gets there. An eviction pass over
// a pool of N objects thus costs a scan and O(N) selection instead of an
// O(N log N) sort.
type evictOrder struct {
	s      *Service
	c      []candidate
	sorted int // c[:sorted] are the smallest leases, in order
}

func (e *evictOrder) len() int { return len(e.c) }

func (e *evictOrder) at(i int) *candidate {
	if i >= e.sorted {
		slices.SortFunc(e.c[e.sorted:], byLease)
		e.sorted = len(e.c)
	}
	return &e.c[i]
}

// release hands the candidate buffer back for the next eviction (evictMu
// is held), without the pointers it held.
func (e *evictOrder) release() {
	clear(e.c)
	e.s.evictBuf = e.c[:0]
}

func byLease(a, b candidate) int { return cmp.Compare(a.lease, b.lease) }

// candidates lists the objects ok accepts in an evictOrder whose sorted
// front is expected to free target bytes (bytesOf tells what each frees).
// evictMu is held: the list reuses the Service's buffer.
func (s *Service) candidates(now time.Time, ok func(*object) bool, bytesOf func(*object) uint64, target float64) *evictOrder {
	cands := s.evictBuf[:0]
	var total uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, o := range sh.objects {
			if ok(o) {
				b := bytesOf(o)
				total += b
				cands = append(cands, candidate{sh: sh, key: key, o: o, lease: o.lease.UnixNano(), bytes: b,
					soft: o.softPinUntil.After(now)})
			}
		}
		sh.mu.Unlock()
	}
	e := &evictOrder{s: s, c: cands}
	if len(cands) == 0 {
		return e
	}
	// Twice the objects of an average size the target needs, and some:
	// rechecks fail and soft pins are skipped; a walk past the front sorts
	// the rest.
	avg := float64(total) / float64(len(cands))
	k := len(cands)
	if avg > 0 {
		k = min(len(cands), 2*int(target/avg)+64)
	}
	selectSmallest(cands, k)
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
