package trace_test

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/mooncake-go/mooncake/bench/trace"
)

// memStore is an in-memory Store that keeps the capacity most recently
// used blocks (all of them when capacity is zero). Its hooks break it on
// purpose.
type memStore struct {
	capacity int

	// corrupt, when it returns true for a key, flips a byte of what
	// BatchGet returns for it.
	corrupt func(key string) bool
	// failGet fails BatchGet of a key; failExist fails every BatchExist.
	failGet   func(key string) bool
	failExist bool

	mu    sync.Mutex
	lru   list.List // of *entry, most recent first
	byKey map[string]*list.Element
	puts  int
}

var _ trace.Store = (*memStore)(nil)

type entry struct {
	key string
	val []byte
}

var errInjected = errors.New("memstore: injected failure")

func newMemStore(capacity int) *memStore {
	return &memStore{capacity: capacity, byKey: map[string]*list.Element{}}
}

func (m *memStore) BatchExist(_ context.Context, keys []string) ([]bool, error) {
	if m.failExist {
		return nil, errInjected
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i] = m.byKey[k]
	}
	return out, nil
}

func (m *memStore) BatchGet(_ context.Context, keys []string, dst [][]byte) []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	errs := make([]error, len(keys))
	for i, k := range keys {
		e, ok := m.byKey[k]
		switch {
		case m.failGet != nil && m.failGet(k):
			errs[i] = errInjected
			continue
		case !ok:
			errs[i] = fmt.Errorf("memstore: %s not found", k)
			continue
		}
		val := e.Value.(*entry).val
		if len(val) != len(dst[i]) {
			errs[i] = fmt.Errorf("memstore: %s has %d bytes, not %d", k, len(val), len(dst[i]))
			continue
		}
		m.lru.MoveToFront(e)
		copy(dst[i], val)
		if m.corrupt != nil && m.corrupt(k) {
			dst[i][len(val)/2] ^= 0x20
		}
	}
	return errs
}

func (m *memStore) BatchPut(_ context.Context, keys []string, values [][]byte) []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, k := range keys {
		m.puts++
		// The replay reuses values: keep a copy.
		val := append([]byte(nil), values[i]...)
		if e, ok := m.byKey[k]; ok {
			e.Value.(*entry).val = val
			m.lru.MoveToFront(e)
			continue
		}
		m.byKey[k] = m.lru.PushFront(&entry{k, val})
		if m.capacity > 0 && m.lru.Len() > m.capacity {
			old := m.lru.Remove(m.lru.Back()).(*entry)
			delete(m.byKey, old.key)
		}
	}
	return make([]error, len(keys))
}

// len is the number of blocks held.
func (m *memStore) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lru.Len()
}
