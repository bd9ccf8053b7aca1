package store

import (
	"fmt"
	"sync"
)

// slots is the index of the floor yardsticks (tcp, memcpy): a buffer of n
// slots of one value each, and which key each slot holds. A put takes the
// next slots in turn, evicting whatever they held (a ring: the oldest
// objects go first, as a full cache's do), and its keys become visible
// once their bytes are in place; a get finds them by name. It is the least
// a store must do to know where an object is, and no more: no leases, so a
// get racing the put that evicts its object may read the new bytes, which
// the runs never do (a get run only reads what its preload wrote, a put run
// never reads).
type slots struct {
	mu   sync.Mutex
	at   map[string]int // visible keys and their slots
	held []string       // the key each slot holds or is being written; "" for none
	next int            // the slot the next put takes
}

func newSlots(n int) *slots {
	return &slots{at: make(map[string]int, n), held: make([]string, n)}
}

// reserve takes len(keys) slots for a put, evicting what they held, and
// appends them to dst. The keys become visible with publish.
func (s *slots) reserve(keys []string, dst []int) ([]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(keys) > len(s.held) {
		return dst, fmt.Errorf("%d objects in one put, more than the %d the store holds", len(keys), len(s.held))
	}
	for _, k := range keys {
		i := s.next
		s.next = (s.next + 1) % len(s.held)
		if old := s.held[i]; old != "" && s.at[old] == i {
			delete(s.at, old)
		}
		// A key put again moves: its old slot no longer holds it.
		if j, ok := s.at[k]; ok {
			delete(s.at, k)
			s.held[j] = ""
		}
		s.held[i] = k
		dst = append(dst, i)
	}
	return dst, nil
}

// publish makes the keys of a put visible in the slots reserve gave them,
// unless a later put has taken a slot since.
func (s *slots) publish(keys []string, at []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for j, k := range keys {
		if s.held[at[j]] == k {
			s.at[k] = at[j]
		}
	}
}

// find appends the slots of keys to dst, or names the first key missing.
func (s *slots) find(keys []string, dst []int) ([]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		i, ok := s.at[k]
		if !ok {
			return dst, fmt.Errorf("%q: no such object", k)
		}
		dst = append(dst, i)
	}
	return dst, nil
}
