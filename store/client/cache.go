package client

import (
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// leaseCache remembers replica lists the master answered, until shortly
// before the lease it granted with them ends. While a lease runs the
// master neither frees nor reuses the object's replicas (an upsert's old
// replicas are freed when the lease ends), so a read from a cached list is
// as safe as one right after the lookup: it sees the value as of the
// lookup, or, after another client's upsert, the value before it, as any
// reader holding a lease would. Entries go when the client itself
// upserts or removes the key, and when a read from them fails; the read is
// then retried with a fresh lookup.
type leaseCache struct {
	mu      sync.Mutex
	entries map[string]*cached
	max     int
}

type cached struct {
	length uint64
	sum    uint32
	reps   []*storepb.MemoryReplica
	start  time.Time // when the lookup was sent: the lease runs from before it
	ttlMs  int64
}

// usableUntil is when an entry stops being used: it leaves the last
// quarter of its lease to the read that uses it.
func usableUntil(start time.Time, ttlMs int64) time.Time {
	ttl := time.Duration(ttlMs) * time.Millisecond
	return start.Add(ttl - ttl/4)
}

func newLeaseCache(n int) *leaseCache {
	return &leaseCache{entries: make(map[string]*cached), max: n}
}

func (c *leaseCache) get(key string, now time.Time) *cached {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil {
		return nil
	}
	if !now.Before(usableUntil(e.start, e.ttlMs)) {
		delete(c.entries, key)
		return nil
	}
	return e
}

func (c *leaseCache) put(key string, e *cached) {
	if e.ttlMs <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		// Full: drop an arbitrary tenth (map order), expired or not.
		keep := c.max - max(c.max/10, 1)
		for k := range c.entries {
			if len(c.entries) <= keep {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = e
}

func (c *leaseCache) drop(keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.entries, k)
	}
}

func (c *leaseCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
}
