package master

import (
	"cmp"
	"context"
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

// startEvicting is tryStart for a put that found no room: it evicts and
// tries again until the put fits, nothing is left to evict, or it has
// evicted a pool's worth (puts that need no eviction kept taking the room).
// Evictions run one at a time (two would each free the target), and the put
// allocates before it lets the next one in, so puts waiting to evict do not
// take each other's room: the first thing a put does once in is try again,
// in the room the eviction before it made.
func (s *Service) startEvicting(ctx context.Context, clientID, key string, length uint64, n int, cfg *storepb.ReplicateConfig, upsert bool) ([]*storepb.Replica, uint64, error) {
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
	if now.Sub(s.evictCacheAt) > evictCacheTTL && s.evictBuf != nil {
		// Idle (or a put load that slowed down): let go of the front and
		// of the buffer, which a pool's worth of candidates made large.
		clear(s.evictCache)
		s.evictCache, s.evictBuf = nil, nil
	}
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

	freed = s.evictFromCache(now, force, target)
	if float64(freed) >= target {
		return freed
	}
	// The scan reuses the buffer the front lives in; what is left of the
	// front (pinned objects) it finds again.
	clear(s.evictCache)
	s.evictCache = nil
	order := s.candidates(now, func(o *object) bool { return evictable(o, now, force) }, dramBytes, target,
		&s.evictBuf, evictFronts)
	defer order.release()
	for pass := range 2 {
		for i := range order.len() {
			if float64(freed) >= target {
				if pass == 0 {
					s.evictCache, s.evictCacheAt = order.keep(i), now
				}
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

// evictFronts is how many evictions' worth of the oldest objects a scan of
// the pool sorts; what one eviction leaves of that front serves the next
// ones for up to evictCacheTTL, so a pool of N objects is scanned once per
// few evictions, not once per eviction.
const (
	evictFronts   = 4
	evictCacheTTL = time.Second
)

// evictFromCache takes the oldest objects that the last scan sorted and the
// evictions since have left, skipping any touched since (its lease moved:
// it is no longer that old) and soft-pinned ones, until target is freed or
// the front runs out. Objects outside the front were newer than all in it,
// so this is the order a fresh scan would give, but for an object with an
// older lease that became evictable since the scan (an upsert revoked, or
// for a forced eviction after an unforced scan, a move in flight): it waits
// for the next scan, within evictCacheTTL. evictMu is held.
func (s *Service) evictFromCache(now time.Time, force bool, target float64) uint64 {
	if now.Sub(s.evictCacheAt) > evictCacheTTL {
		clear(s.evictCache)
		s.evictCache = nil
	}
	var freed uint64
	var pinned []int // entries passed over for a running soft pin: they stay
	i := 0
	for ; i < len(s.evictCache) && float64(freed) < target; i++ {
		c := &s.evictCache[i]
		c.sh.mu.Lock()
		switch {
		case c.sh.objects[c.key] != c.o || c.o.lease.UnixNano() != c.lease || !evictable(c.o, now, force):
			// Gone, touched, or not evictable now: a later scan puts it
			// where it belongs.
		case c.o.softPinUntil.After(now):
			pinned = append(pinned, i)
		default:
			freed += s.evictLocked(c.sh, c.key, c.o, force)
		}
		c.sh.mu.Unlock()
	}
	j := keepBefore(s.evictCache, i, pinned)
	clear(s.evictCache[:j])
	s.evictCache = s.evictCache[j:]
	return freed
}

// keepBefore moves the entries at the indices in ret (increasing, all below
// i) to just before i, in order, and returns where they start: c[j:] is
// what a walk that stopped at i leaves, with the entries it kept.
func keepBefore(c []candidate, i int, ret []int) (j int) {
	j = i
	for k := len(ret) - 1; k >= 0; k-- {
		j--
		c[j] = c[ret[k]]
	}
	return j
}

// evictOrder is the objects an eviction may take, least recently leased
// first. Only the front expected to cover a few evictions is sorted up
// front; the rest is sorted if a walk gets there. An eviction pass over a
// pool of N objects thus costs a scan and O(N) selection instead of an
// O(N log N) sort.
type evictOrder struct {
	buf    *[]candidate // where the buffer goes back
	c      []candidate
	sorted int // c[:sorted] are the smallest leases, in order
	kept   int // c[kept:sorted] stay as the Service's evictCache; -1: none
}

func (e *evictOrder) len() int { return len(e.c) }

func (e *evictOrder) at(i int) *candidate {
	if i >= e.sorted {
		slices.SortFunc(e.c[e.sorted:], byLease)
		e.sorted = len(e.c)
	}
	return &e.c[i]
}

// keep returns what a first pass that stopped at i leaves of the sorted
// front: the soft-pinned objects it passed over (their pins may end first),
// then the front from i on. release leaves it in place for the next
// evictions (see evictFromCache).
func (e *evictOrder) keep(i int) []candidate {
	var soft []int
	for k := range i {
		if e.c[k].soft {
			soft = append(soft, k)
		}
	}
	e.kept = keepBefore(e.c, i, soft)
	return e.c[e.kept:e.sorted]
}

// release hands the candidate buffer back for the next scan (evictMu is
// held), without the pointers it held except the kept front.
func (e *evictOrder) release() {
	if e.kept < 0 {
		clear(e.c)
	} else {
		clear(e.c[:e.kept])
		clear(e.c[e.sorted:])
	}
	*e.buf = e.c[:0]
}

func byLease(a, b candidate) int { return cmp.Compare(a.lease, b.lease) }

// candidates lists the objects ok accepts in an evictOrder whose sorted
// front is expected to free target bytes fronts times over (bytesOf tells
// what each frees). evictMu is held: the list reuses *buf.
func (s *Service) candidates(now time.Time, ok func(*object) bool, bytesOf func(*object) uint64, target float64,
	buf *[]candidate, fronts int) *evictOrder {
	cands := (*buf)[:0]
	var total uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, o := range sh.objects {
			if ok(o) {
				total += bytesOf(o)
				cands = append(cands, candidate{sh: sh, key: key, o: o, lease: o.lease.UnixNano(),
					soft: o.softPinUntil.After(now)})
			}
		}
		sh.mu.Unlock()
	}
	e := &evictOrder{buf: buf, c: cands, kept: -1}
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
