package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"runtime/cgo"
	"sync"
	"time"

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

// newEngineObj wraps e for C; timeout is the engine's request timeout.
func newEngineObj(e *engine.Engine, timeout time.Duration) *engineObj {
	return &engineObj{Engine: e, timeout: timeout, bufs: map[uintptr]*engine.Buffer{}}
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

	// ops is held for reading by every call in progress on the store and
	// for writing by close, so that a call racing close either finishes
	// or answers INVALID_HANDLE (the client itself waits for the puts and
	// gets in progress before it frees their memory).
	ops    sync.RWMutex
	closed bool // under ops
}

// enterStore looks the store h up and marks a call in progress on it; the
// caller defers leave. A store that closed meanwhile is INVALID_HANDLE.
func enterStore(h uint64) (*storeObj, error) {
	s, err := stores.of(h)
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

// handleKind is one kind of object a handle names: engines or stores.
type handleKind[T interface{ close() error }] struct {
	name  string // "engine"
	wrong string // what a handle of the other kind is: "a store, not an engine"
}

var (
	engines = handleKind[*engineObj]{name: "engine", wrong: "a store, not an engine"}
	stores  = handleKind[*storeObj]{name: "store", wrong: "an engine, not a store"}
)

// of looks h up; a released, made-up or other kind of handle is
// INVALID_HANDLE.
func (k handleKind[T]) of(h uint64) (T, error) {
	var zero T
	v, ok := live.Load(h)
	if !ok {
		return zero, k.notLive(h)
	}
	t, ok := v.(T)
	if !ok {
		return zero, abiErrorf(C.MC_ERR_INVALID_HANDLE, "%s handle %d: names %s", k.name, h, k.wrong)
	}
	return t, nil
}

func (k handleKind[T]) notLive(h uint64) error {
	return abiErrorf(C.MC_ERR_INVALID_HANDLE, "%s handle %d: not a live handle", k.name, h)
}

// destroy forgets h and closes what it named; of several calls racing to
// destroy one handle, the others find it not live.
func (k handleKind[T]) destroy(h uint64) error {
	if _, err := k.of(h); err != nil {
		return err
	}
	v, ok := live.LoadAndDelete(h)
	if !ok {
		return k.notLive(h)
	}
	cgo.Handle(h).Delete()
	return v.(T).close()
}

// engineCall is the body of an engine export: f runs on the engine h under
// guard.
func engineCall(h C.mc_engine_t, cerr *C.mc_error_t, f func(e *engineObj) error) C.mc_status_t {
	return guard(cerr, domainEngine, func() error {
		e, err := engines.of(uint64(h))
		if err != nil {
			return err
		}
		return f(e)
	})
}

// storeCall is the body of a store export: f runs on the store h under
// guard, as a call in progress (enterStore).
func storeCall(h C.mc_store_t, cerr *C.mc_error_t, f func(s *storeObj) error) C.mc_status_t {
	return guard(cerr, domainStore, func() error {
		s, err := enterStore(uint64(h))
		if err != nil {
			return err
		}
		defer s.leave()
		return f(s)
	})
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
