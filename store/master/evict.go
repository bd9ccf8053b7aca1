package master

import (
	"slices"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// candidate is an object eviction may take.
type candidate struct {
	sh    *shard
	key   string
	o     *object
	lease time.Time
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

	cands := s.candidates(now, func(o *object) bool { return evictable(o, now, force) })

	var freed uint64
	for pass := range 2 {
		for _, c := range cands {
			if float64(freed) >= target {
				return freed
			}
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

// evictable: a DRAM replica eviction may take. A move in flight protects
// the object, except from a forced eviction (a put needs the room now).
// candidates lists the objects ok accepts, least recently leased first.
func (s *Service) candidates(now time.Time, ok func(*object) bool) []candidate {
	var cands []candidate
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, o := range sh.objects {
			if ok(o) {
				cands = append(cands, candidate{sh: sh, key: key, o: o, lease: o.lease, soft: o.softPinUntil.After(now)})
			}
		}
		sh.mu.Unlock()
	}
	slices.SortFunc(cands, func(a, b candidate) int { return a.lease.Compare(b.lease) })
	return cands
}

func evictable(o *object, now time.Time, force bool) bool {
	return o.complete() && o.pending == nil && (o.moving == nil || force) && !o.hardPin && !o.lease.After(now) &&
		!o.replicas[0].onDisk() // DRAM replicas come first
}
