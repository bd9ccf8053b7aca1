package engine

import (
	"errors"
	"fmt"
)

// Code is a Transfer Engine error code, numbered as Mooncake's error.h. The
// same table is the status enum of the C ABI.
type Code int

const (
	CodeOK                   Code = 0
	CodeInvalidArgument      Code = -1
	CodeTooManyRequests      Code = -2
	CodeAddressNotRegistered Code = -3
	CodeBatchBusy            Code = -4
	CodeDeviceNotFound       Code = -6
	CodeAddressOverlapped    Code = -7
	CodeDNS                  Code = -101
	CodeSocket               Code = -102
	CodeMalformedJSON        Code = -103
	CodeRejectHandshake      Code = -104
	CodeMetadata             Code = -200
	CodeEndpoint             Code = -201
	CodeContext              Code = -202
	CodeNUMA                 Code = -300
	CodeClock                Code = -301
	CodeMemory               Code = -302
	CodeNotImplemented       Code = -303
)

var codeNames = map[Code]string{
	CodeOK: "ok", CodeInvalidArgument: "invalid argument", CodeTooManyRequests: "too many requests",
	CodeAddressNotRegistered: "address not registered", CodeBatchBusy: "batch busy",
	CodeDeviceNotFound: "device not found", CodeAddressOverlapped: "address overlapped",
	CodeDNS: "dns", CodeSocket: "socket", CodeMalformedJSON: "malformed json",
	CodeRejectHandshake: "handshake rejected", CodeMetadata: "metadata", CodeEndpoint: "endpoint",
	CodeContext: "context", CodeNUMA: "numa", CodeClock: "clock", CodeMemory: "memory",
	CodeNotImplemented: "not implemented",
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("code %d", int(c))
}

// Error is an engine error carrying its code. Sentinels below are *Error
// values; errors.Is matches any *Error with the same code, and, through
// Unwrap, the cause the error was built from (a context's error, a
// transport or metadata failure), so that errors.Is(err, context.Canceled)
// holds for a call its context ended.
type Error struct {
	Code Code
	Msg  string // what failed; the cause's text follows it in Error
	Err  error  // the cause, or nil
}

func (e *Error) Error() string {
	switch {
	case e.Err == nil:
		return "engine: " + e.Msg
	case e.Msg == "":
		return "engine: " + e.Err.Error()
	}
	return "engine: " + e.Msg + ": " + e.Err.Error()
}

// Unwrap returns the cause, so that errors.Is and errors.As see through
// the code to it.
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrBatchBusy) true for every error of that code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

func errorf(code Code, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// wrapf is errorf for a failure caused by err, which the result keeps.
func wrapf(code Code, err error, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...), Err: err}
}

// Sentinels, one per code the engine returns.
var (
	ErrInvalidArgument      = &Error{Code: CodeInvalidArgument, Msg: "invalid argument"}
	ErrTooManyRequests      = &Error{Code: CodeTooManyRequests, Msg: "too many requests"}
	ErrAddressNotRegistered = &Error{Code: CodeAddressNotRegistered, Msg: "address not registered"}
	ErrBatchBusy            = &Error{Code: CodeBatchBusy, Msg: "batch busy"}
	ErrDeviceNotFound       = &Error{Code: CodeDeviceNotFound, Msg: "device not found"}
	ErrAddressOverlapped    = &Error{Code: CodeAddressOverlapped, Msg: "address overlapped"}
	ErrSocket               = &Error{Code: CodeSocket, Msg: "socket"}
	ErrMalformedJSON        = &Error{Code: CodeMalformedJSON, Msg: "malformed json"}
	ErrRejectHandshake      = &Error{Code: CodeRejectHandshake, Msg: "handshake rejected"}
	ErrMetadata             = &Error{Code: CodeMetadata, Msg: "metadata"}
	ErrMemory               = &Error{Code: CodeMemory, Msg: "memory"}
	ErrNotImplemented       = &Error{Code: CodeNotImplemented, Msg: "not implemented"}
	// ErrClosed is returned by calls on a closed engine.
	ErrClosed = &Error{Code: CodeContext, Msg: "engine closed"}
)

// CodeOf returns the code of err: CodeOK for nil, the carried code for an
// *Error, CodeInvalidArgument otherwise.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInvalidArgument
}
