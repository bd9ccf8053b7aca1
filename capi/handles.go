package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"context"
	"fmt"
	"runtime/cgo"
	"sync"
	"sync/atomic"
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

// lifetime is what every handle's object carries besides the object: the
// context its blocking calls derive from, which destroying the handle
// cancels so that they return rather than hold the destroy up, and the
// poison a panic leaves (after a panic the object's state is not to be
// trusted, so the handle refuses every call but its destroy).
type lifetime struct {
	kind   string // "engine" or "store", for messages
	ctx    context.Context
	cancel context.CancelFunc
	poison atomic.Pointer[string] // the first panic's value, printed
}

func (l *lifetime) init(kind string) {
	l.kind = kind
	l.ctx, l.cancel = context.WithCancel(context.Background())
}

// usable refuses a poisoned handle h: for a call that takes the object
// as an argument of another's (a store created over an engine).
func (l *lifetime) usable(h uint64) error {
	if p := l.poison.Load(); p != nil {
		return abiErrorf(statusPanic, "%s handle %d is poisoned: an earlier call on it panicked (%s); only its destroy/close works",
			l.kind, h, *p)
	}
	return nil
}

// run runs f as one call on the handle h: refused once the handle is
// poisoned; a panic in f poisons it and goes on up to guard or teCall; an
// error of f once the handle was destroyed is MC_ERR_CANCELED, whatever
// code it had (the destroy is why it failed).
func (l *lifetime) run(h uint64, f func() error) error {
	if err := l.usable(h); err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			msg := fmt.Sprint(r)
			l.poison.CompareAndSwap(nil, &msg)
			panic(r)
		}
	}()
	err := f()
	if err != nil && l.ctx.Err() != nil {
		return abiErrorf(C.MC_ERR_CANCELED, "%s handle %d was destroyed during the call: %v", l.kind, h, err)
	}
	return err
}

// newEngineObj wraps e for C; timeout is the engine's request timeout.
func newEngineObj(e *engine.Engine, timeout time.Duration) *engineObj {
	o := &engineObj{Engine: e, timeout: timeout, bufs: map[uintptr]*engine.Buffer{}}
	o.init("engine")
	return o
}

// engineObj is an engine as C sees it.
type engineObj struct {
	*engine.Engine
	lifetime
	// timeout bounds calls that wait on a peer (opening a segment, sending
	// a notification): the engine's request timeout.
	timeout time.Duration

	mu   sync.Mutex
	bufs map[uintptr]*engine.Buffer // from mc_engine_allocate_buffer
}

// newStoreObj wraps c for C; opTimeout bounds each call (0: no bound).
func newStoreObj(c *client.Client, opTimeout time.Duration) *storeObj {
	s := &storeObj{Client: c, opTimeout: opTimeout}
	s.init("store")
	return s
}

// storeObj is a store client as C sees it.
type storeObj struct {
	*client.Client
	lifetime
	opTimeout time.Duration // mc_store_config_t.op_timeout_ms

	// ops is held for reading by every call in progress on the store and
	// for writing by close, so that a call racing close either finishes
	// or answers INVALID_HANDLE (the client itself waits for the puts and
	// gets in progress before it frees their memory).
	ops    sync.RWMutex
	closed bool // under ops
}

// callCtx is the context of one call on the store: canceled when the
// store closes, and past op_timeout_ms when the config set one.
func (s *storeObj) callCtx() (context.Context, context.CancelFunc) {
	if s.opTimeout > 0 {
		return context.WithTimeout(s.ctx, s.opTimeout)
	}
	return context.WithCancel(s.ctx)
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

// close cancels the calls in progress and waits for them to return, then
// closes the client.
func (s *storeObj) close() error {
	s.cancel()
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
		return onEngine(uint64(h), f)
	})
}

// onEngine runs f on the engine h as one call on it (lifetime.run).
func onEngine(h uint64, f func(e *engineObj) error) error {
	e, err := engines.of(h)
	if err != nil {
		return err
	}
	return e.run(h, func() error { return f(e) })
}

// storeCall is the body of a store export: f runs on the store h under
// guard, as a call in progress (enterStore), with the call's context
// (callCtx). A call that ran past op_timeout_ms is MC_ERR_TIMED_OUT.
func storeCall(h C.mc_store_t, cerr *C.mc_error_t, f func(ctx context.Context, s *storeObj) error) C.mc_status_t {
	return guard(cerr, domainStore, func() error {
		s, err := enterStore(uint64(h))
		if err != nil {
			return err
		}
		defer s.leave()
		return s.run(uint64(h), func() error {
			ctx, cancel := s.callCtx()
			defer cancel()
			err := f(ctx, s)
			// Past the deadline, not only ctx.Err(): a socket deadline set
			// to the same instant (the engine's handshake) can fire before
			// ctx's timer, and the call then ended with an i/o timeout.
			if err != nil && s.ctx.Err() == nil && pastDeadline(ctx) {
				return abiErrorf(C.MC_ERR_TIMED_OUT, "store handle %d: call not done after op_timeout_ms %d: %v", h, s.opTimeout.Milliseconds(), err)
			}
			return err
		})
	})
}

// pastDeadline reports whether ctx's deadline has come, whether or not
// its timer has marked it done yet.
func pastDeadline(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// close cancels the calls in progress, frees the buffers left from
// mc_engine_allocate_buffer and closes the engine.
func (e *engineObj) close() error {
	e.cancel()
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
