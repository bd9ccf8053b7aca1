package p2p

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/mooncake-go/mooncake/engine"
)

// maxChunk is the largest range registered with the engine at once, as
// Mooncake does so that RDMA NICs can pin it.
const maxChunk = 4 << 30

// span is a range of this process's memory.
type span struct {
	addr, size uint64
}

func (s span) end() uint64 { return s.addr + s.size }

func (s span) overlaps(o span) bool { return s.addr < o.end() && o.addr < s.end() }

// memory registers buffers with the engine in chunks and counts references
// per chunk, so a buffer given both to Register and GetReplica (or to two
// Registers) is registered once and unregistered with its last user. A
// chunk that overlaps another one without being equal to it is refused.
type memory struct {
	e     *engine.Engine
	chunk uint64 // maxChunk; tests shrink it

	mu   sync.Mutex
	refs map[span]*chunkRef
}

type chunkRef struct {
	n     int
	owned bool // false: the engine already had it (AllocateBuffer, the caller)
}

func newMemory(e *engine.Engine) *memory {
	return &memory{e: e, chunk: maxChunk, refs: map[span]*chunkRef{}}
}

// chunks cuts buffers into the chunks they are registered as, in order.
func (m *memory) chunks(bufs []span) []span {
	var cs []span
	for _, b := range bufs {
		for off := uint64(0); off < b.size; off += m.chunk {
			cs = append(cs, span{b.addr + off, min(m.chunk, b.size-off)})
		}
	}
	return cs
}

// add registers bufs (already checked to be non-empty and not to wrap) and
// returns their chunks; on error nothing stays registered.
func (m *memory) add(bufs []span, location string) ([]span, error) {
	for i, a := range bufs {
		for _, b := range bufs[:i] {
			if a.overlaps(b) {
				return nil, fmt.Errorf("%w: buffers %#x+%d and %#x+%d", ErrAddressOverlapped, b.addr, b.size, a.addr, a.size)
			}
		}
	}
	cs := m.chunks(bufs)
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, c := range cs {
		if err := m.addLocked(c, location); err != nil {
			m.removeLocked(cs[:i])
			return nil, err
		}
	}
	return cs, nil
}

func (m *memory) addLocked(c span, location string) error {
	if r, ok := m.refs[c]; ok {
		r.n++
		return nil
	}
	for o := range m.refs {
		if o.overlaps(c) {
			return fmt.Errorf("%w: %#x+%d overlaps %#x+%d registered before", ErrAddressOverlapped, c.addr, c.size, o.addr, o.size)
		}
	}
	r := &chunkRef{n: 1, owned: true}
	err := m.e.RegisterMemory(context.Background(), uintptr(c.addr), c.size, location, true)
	switch {
	case errors.Is(err, engine.ErrAddressOverlapped):
		// Someone registered this memory with the engine directly; it
		// stays theirs to unregister.
		r.owned = false
	case err != nil:
		return fmt.Errorf("%w: register %#x+%d: %w", ErrTransferEngine, c.addr, c.size, err)
	}
	m.refs[c] = r
	return nil
}

// remove drops one reference to each chunk and unregisters the chunks
// nobody uses any more. It waits for transfers serving them to finish.
func (m *memory) remove(cs []span) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.removeLocked(cs)
}

func (m *memory) removeLocked(cs []span) error {
	var errs []error
	for _, c := range cs {
		r, ok := m.refs[c]
		if !ok {
			continue
		}
		if r.n--; r.n > 0 {
			continue
		}
		delete(m.refs, c)
		if !r.owned {
			continue
		}
		if err := m.e.UnregisterMemory(context.Background(), uintptr(c.addr)); err != nil && !errors.Is(err, engine.ErrClosed) {
			errs = append(errs, fmt.Errorf("%w: unregister %#x: %w", ErrTransferEngine, c.addr, err))
		}
	}
	return errors.Join(errs...)
}
