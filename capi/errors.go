package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include "mooncake.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Domains of mc_error_t: which code table a status belongs to.
const (
	domainNone   = C.MC_DOMAIN_NONE
	domainABI    = C.MC_DOMAIN_ABI
	domainEngine = C.MC_DOMAIN_ENGINE
	domainStore  = C.MC_DOMAIN_STORE
)

// statusPanic is MC_ERR_PANIC: a recovered panic, or a call on a handle
// that one poisoned.
const statusPanic = C.MC_ERR_PANIC

// abiError is a failure of the C ABI itself (a bad handle, a NULL
// argument), answered with an MC_ERR_* code whatever the call's domain.
type abiError struct {
	code C.mc_status_t
	msg  string
}

func (e *abiError) Error() string { return e.msg }

func abiErrorf(code C.mc_status_t, format string, args ...any) error {
	return &abiError{code: code, msg: fmt.Sprintf(format, args...)}
}

// nullArg is the error of a required pointer argument that is NULL.
func nullArg(name string) error {
	return abiErrorf(C.MC_ERR_NULL_ARGUMENT, "%s is NULL", name)
}

// invalidArg is an engine's INVALID_ARGUMENT.
func invalidArg(format string, args ...any) error {
	return &engine.Error{Code: engine.CodeInvalidArgument, Msg: fmt.Sprintf(format, args...)}
}

// invalidParams is a store's INVALID_PARAMS.
func invalidParams(format string, args ...any) error {
	return &storepb.Error{Code: storepb.InvalidParams, Msg: fmt.Sprintf(format, args...)}
}

// guard is the body of every mooncake.h export: it clears the caller's
// error struct, runs f, reports f's error in the domain dom and turns a
// panic into MC_ERR_PANIC.
func guard(cerr *C.mc_error_t, dom C.int32_t, f func() error) (st C.mc_status_t) {
	c := begin(cerr, dom)
	defer c.catch(&st)
	return c.fail(f())
}

// call is the bookkeeping of one export: where its error goes and which
// code table it answers in.
type call struct {
	err *C.mc_error_t
	dom C.int32_t
}

// begin clears the caller's error struct, so that a successful call leaves
// MC_OK and an empty message behind.
func begin(cerr *C.mc_error_t, dom C.int32_t) call {
	if cerr != nil {
		cerr.code, cerr.domain, cerr.message[0] = C.MC_OK, domainNone, 0
	}
	return call{err: cerr, dom: dom}
}

// panics counts recovered panics; the first one's stack goes to the log.
var panics atomic.Int64

// catch is deferred by guard: it turns a panic into MC_ERR_PANIC.
func (c call) catch(st *C.mc_status_t) {
	if r := recover(); r != nil {
		*st = c.set(statusPanic, domainABI, fmt.Sprintf("internal panic (recovered): %v", r))
		if panics.Add(1) == 1 {
			slog.Error("libmooncake: recovered a panic; the call failed with MC_ERR_PANIC",
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}
}

// set writes code, domain and message to the caller's error struct and
// returns code.
func (c call) set(code C.mc_status_t, dom C.int32_t, msg string) C.mc_status_t {
	if c.err != nil {
		c.err.code, c.err.domain = code, dom
		writeCString(unsafe.Pointer(&c.err.message[0]), C.MC_ERROR_MESSAGE_SIZE, msg)
	}
	return code
}

// fail reports err in the call's domain and returns its code.
func (c call) fail(err error) C.mc_status_t {
	if err == nil {
		return C.MC_OK
	}
	var code C.mc_status_t
	dom := c.dom
	var ae *abiError
	var ee *engine.Error
	switch {
	case errors.As(err, &ae):
		code, dom = ae.code, domainABI
	case c.dom == domainStore:
		code = storeCode(err)
	case errors.As(err, &ee):
		// The engine's own code, even where a context's deadline is the
		// cause (a handshake that timed out is a socket error).
		code = C.mc_status_t(ee.Code)
	case errors.Is(err, context.DeadlineExceeded):
		code, dom = C.MC_ERR_TIMED_OUT, domainABI
	default:
		code = C.mc_status_t(engine.CodeOf(err))
	}
	return c.set(code, dom, err.Error())
}

// storeCode maps an error of a store call to a store code: a store error
// keeps its code; an engine's invalid argument is the store's
// INVALID_PARAMS; a deadline is RPC_TIMEOUT; anything else INTERNAL.
func storeCode(err error) C.mc_status_t {
	var se *storepb.Error
	var ee *engine.Error
	switch {
	case errors.As(err, &se):
		return C.mc_status_t(se.Code)
	case errors.As(err, &ee) && ee.Code == engine.CodeInvalidArgument:
		return C.MC_STORE_ERR_INVALID_PARAMS
	case ee != nil:
		return C.MC_STORE_ERR_INTERNAL // even with a deadline as its cause
	case errors.Is(err, context.DeadlineExceeded):
		return C.MC_STORE_ERR_RPC_TIMEOUT
	}
	return C.MC_STORE_ERR_INTERNAL
}

// writeCString copies s into the C buffer [p, p+size) and NUL-terminates
// it, truncating s when it does not fit. It returns len(s)+1, the size s
// needs.
func writeCString(p unsafe.Pointer, size int, s string) int {
	if p != nil && size > 0 {
		dst := unsafe.Slice((*byte)(p), size)
		n := copy(dst[:size-1], s)
		dst[n] = 0
	}
	return len(s) + 1
}

// cString returns the Go copy of a C string; NULL is "".
func cString(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// The library logs through slog at MC_LOG_LEVEL (debug, info, warn, error;
// default warn, so that a host process's stderr stays quiet).
func init() {
	level := slog.LevelWarn
	switch strings.ToLower(os.Getenv("MC_LOG_LEVEL")) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "error":
		level = slog.LevelError
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
}
