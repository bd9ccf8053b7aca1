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
// values; errors.Is matches any *Error with the same code.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return "engine: " + e.Msg }

// Is makes errors.Is(err, ErrBatchBusy) true for every error of that code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

func errorf(code Code, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Sentinels, one per code the engine returns.
var (
	ErrInvalidArgument      = &Error{CodeInvalidArgument, "invalid argument"}
	ErrTooManyRequests      = &Error{CodeTooManyRequests, "too many requests"}
	ErrAddressNotRegistered = &Error{CodeAddressNotRegistered, "address not registered"}
	ErrBatchBusy            = &Error{CodeBatchBusy, "batch busy"}
	ErrAddressOverlapped    = &Error{CodeAddressOverlapped, "address overlapped"}
	ErrSocket               = &Error{CodeSocket, "socket"}
	ErrMalformedJSON        = &Error{CodeMalformedJSON, "malformed json"}
	ErrRejectHandshake      = &Error{CodeRejectHandshake, "handshake rejected"}
	ErrMetadata             = &Error{CodeMetadata, "metadata"}
	ErrMemory               = &Error{CodeMemory, "memory"}
	ErrNotImplemented       = &Error{CodeNotImplemented, "not implemented"}
	// ErrClosed is returned by calls on a closed engine.
	ErrClosed = &Error{CodeContext, "engine closed"}
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
