package client

import (
	"context"
	"sync"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/alloc"
)

// stage is the client's registered staging memory: values that live in Go
// memory pass through it on their way to or from the engine. Space is
// handed out by the master's allocator (O(1), no fragmentation drift under
// equal sizes); a caller that finds it full waits for a release.
type stage struct {
	buf *engine.Buffer

	mu    sync.Mutex
	alloc *alloc.Allocator
	freed chan struct{} // closed and replaced on every release
}

func newStage(ctx context.Context, e *engine.Engine, size int64) (*stage, error) {
	buf, err := e.AllocateBuffer(ctx, int(size), "")
	if err != nil {
		return nil, err
	}
	a, err := alloc.New(uint64(size))
	if err != nil {
		_ = buf.Free()
		return nil, err
	}
	return &stage{buf: buf, alloc: a, freed: make(chan struct{})}, nil
}

// max is the largest piece one acquire may ask for: a quarter of the
// buffer, so concurrent callers never starve each other for good.
func (s *stage) max() uint64 { return s.alloc.Size() / 4 }

// acquire returns n bytes of staging memory, waiting while it is full.
func (s *stage) acquire(ctx context.Context, n uint64) ([]byte, error) {
	for {
		s.mu.Lock()
		off, ok := s.alloc.Alloc(n)
		freed := s.freed
		s.mu.Unlock()
		if ok {
			return s.buf.Bytes()[off : off+n : off+n], nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-freed:
		}
	}
}

// tryAcquire is acquire without waiting.
func (s *stage) tryAcquire(n uint64) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	off, ok := s.alloc.Alloc(n)
	if !ok {
		return nil, false
	}
	return s.buf.Bytes()[off : off+n : off+n], true
}

// release gives back memory from acquire.
func (s *stage) release(b []byte) {
	off := uint64(engine.AddrOf(b) - s.buf.Addr())
	s.mu.Lock()
	_ = s.alloc.Free(off)
	close(s.freed)
	s.freed = make(chan struct{})
	s.mu.Unlock()
}

func (s *stage) free() error { return s.buf.Free() }
