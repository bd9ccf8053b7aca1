package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"runtime/cgo"
	"sync"
	"time"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
)

// live holds every engine and store C may name, keyed by the number
// cgo.NewHandle issued for it. Lookups go through live rather than
// cgo.Handle.Value, which panics on a released or made-up number: a stale
// handle from C is an error, not a crash.
var live sync.Map // uint64 -> *engineObj | *storeObj

// newHandle makes v nameable from C and returns its handle (never 0).
func newHandle(v any) uint64 {
	h := cgo.NewHandle(v)
	live.Store(uint64(h), v)
	return uint64(h)
}

// releaseHandle forgets h and returns what it named; only one caller of
// several racing gets it.
func releaseHandle(h uint64) (any, bool) {
	v, ok := live.LoadAndDelete(h)
	if ok {
		cgo.Handle(h).Delete()
	}
	return v, ok
}

// engineObj is an engine as C sees it.
type engineObj struct {
	*engine.Engine
	// timeout bounds calls that wait on a peer (opening a segment, sending
	// a notification): the engine's request timeout.
	timeout time.Duration

	mu   sync.Mutex
	bufs map[uintptr]*engine.Buffer // from mc_engine_allocate_buffer
}

// storeObj is a store client as C sees it.
type storeObj struct {
	*client.Client

	mu   sync.Mutex
	regs map[uintptr]uintptr // buffers registered through the ABI: start -> length

	// ops is held for reading by every call in progress on the store and
	// for writing by close, which so waits for them before it frees the
	// staging buffer and the segment they may be copying from or into.
	ops    sync.RWMutex
	closed bool // under ops
}

// enterStore looks the store h up and marks a call in progress on it; the
// caller defers leave. A store that closed meanwhile is INVALID_HANDLE.
func enterStore(h uint64) (*storeObj, error) {
	s, err := storeOf(h)
	if err != nil {
		return nil, err
	}
	s.ops.RLock()
	if s.closed {
		s.ops.RUnlock()
		return nil, abiErrorf(C.MC_ERR_INVALID_HANDLE, "store handle %d: closed", h)
	}
	return s, nil
}

// leave ends a call that enterStore began.
func (s *storeObj) leave() { s.ops.RUnlock() }

// close waits for the calls in progress, then closes the client.
func (s *storeObj) close() error {
	s.ops.Lock()
	defer s.ops.Unlock()
	s.closed = true
	return s.Client.Close()
}

// registered reports whether b lies within a buffer registered through
// mc_store_register_buffer (what put_from requires).
func (s *storeObj) registered(b []byte) bool {
	a, n := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b))
	s.mu.Lock()
	defer s.mu.Unlock()
	for start, l := range s.regs {
		if a >= start && a+n <= start+l {
			return true
		}
	}
	return false
}

func engineOf(h uint64) (*engineObj, error) {
	v, ok := live.Load(h)
	if !ok {
		return nil, abiErrorf(C.MC_ERR_INVALID_HANDLE, "engine handle %d: not a live handle", h)
	}
	e, ok := v.(*engineObj)
	if !ok {
		return nil, abiErrorf(C.MC_ERR_INVALID_HANDLE, "engine handle %d: names a store, not an engine", h)
	}
	return e, nil
}

func storeOf(h uint64) (*storeObj, error) {
	v, ok := live.Load(h)
	if !ok {
		return nil, abiErrorf(C.MC_ERR_INVALID_HANDLE, "store handle %d: not a live handle", h)
	}
	s, ok := v.(*storeObj)
	if !ok {
		return nil, abiErrorf(C.MC_ERR_INVALID_HANDLE, "store handle %d: names an engine, not a store", h)
	}
	return s, nil
}

// close frees the buffers left from mc_engine_allocate_buffer and closes
// the engine.
func (e *engineObj) close() error {
	e.mu.Lock()
	bufs := e.bufs
	e.bufs = nil
	e.mu.Unlock()
	err := e.Engine.Close()
	for _, b := range bufs {
		_ = b.Free()
	}
	return err
}
