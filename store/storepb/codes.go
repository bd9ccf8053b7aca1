package storepb

import (
	"errors"
	"fmt"
)

// Code is a Mooncake Store ErrorCode, as carried in Result.code. The same
// numbers are the store's status values in the C ABI.
type Code int32

// Codes with the numbers of Mooncake's ErrorCode.
const (
	OK                  Code = 0
	Internal            Code = -1
	SegmentNotFound     Code = -101
	NoAvailableHandle   Code = -200 // the pool is full
	InvalidParams       Code = -600
	ObjectNotFound      Code = -704
	ObjectAlreadyExists Code = -705
	ObjectHasLease      Code = -706
	LeaseExpired        Code = -707
	TransferFail        Code = -800
	ChecksumMismatch    Code = -801
	RPCFail             Code = -900
	RPCTimeout          Code = -901
	EtcdOperationError  Code = -1000
	// TenantQuotaExceeded: the put would take its tenant over its quota.
	TenantQuotaExceeded Code = -1700
)

var codeNames = map[Code]string{
	OK: "OK", Internal: "INTERNAL", SegmentNotFound: "SEGMENT_NOT_FOUND",
	NoAvailableHandle: "NO_AVAILABLE_HANDLE", InvalidParams: "INVALID_PARAMS",
	ObjectNotFound: "OBJECT_NOT_FOUND", ObjectAlreadyExists: "OBJECT_ALREADY_EXISTS",
	ObjectHasLease: "OBJECT_HAS_LEASE", LeaseExpired: "LEASE_EXPIRED",
	TransferFail: "TRANSFER_FAIL", ChecksumMismatch: "CHECKSUM_MISMATCH",
	RPCFail: "RPC_FAIL", RPCTimeout: "RPC_TIMEOUT", EtcdOperationError: "ETCD_OPERATION_ERROR",
	TenantQuotaExceeded: "TENANT_QUOTA_EXCEEDED",
}

// String is Mooncake's name of the code.
func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("ERROR_%d", int32(c))
}

// Error is a store error with its code. errors.Is matches errors of the
// same code, so callers test against the sentinels below, and, through
// Unwrap, the cause the error was built from (a context's error, an
// engine or transport failure). A cause does not cross the wire: a Result
// carries its text only.
type Error struct {
	Code Code
	Msg  string // what failed; the cause's text follows it in Error
	Err  error  // the cause, or nil
}

func (e *Error) Error() string {
	if d := e.detail(); d != "" {
		return "store: " + e.Code.String() + ": " + d
	}
	return "store: " + e.Code.String()
}

// detail is the message and the cause's text, as a Result carries them.
func (e *Error) detail() string {
	switch {
	case e.Err == nil:
		return e.Msg
	case e.Msg == "":
		return e.Err.Error()
	}
	return e.Msg + ": " + e.Err.Error()
}

// Unwrap returns the cause, so that errors.Is and errors.As see through
// the code to it.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels, one per code, for errors.Is.
var (
	ErrInternal            = &Error{Code: Internal}
	ErrSegmentNotFound     = &Error{Code: SegmentNotFound}
	ErrNoAvailableHandle   = &Error{Code: NoAvailableHandle}
	ErrInvalidParams       = &Error{Code: InvalidParams}
	ErrObjectNotFound      = &Error{Code: ObjectNotFound}
	ErrObjectAlreadyExists = &Error{Code: ObjectAlreadyExists}
	ErrObjectHasLease      = &Error{Code: ObjectHasLease}
	ErrLeaseExpired        = &Error{Code: LeaseExpired}
	ErrTransferFail        = &Error{Code: TransferFail}
	ErrChecksumMismatch    = &Error{Code: ChecksumMismatch}
	ErrRPCFail             = &Error{Code: RPCFail}
	ErrRPCTimeout          = &Error{Code: RPCTimeout}
	ErrTenantQuotaExceeded = &Error{Code: TenantQuotaExceeded}
)

// NewResult builds a Result from an error: OK for nil, the code of the
// *Error it wraps, INTERNAL for anything else.
func NewResult(err error) *Result {
	if err == nil {
		return &Result{}
	}
	var e *Error
	switch {
	case !errors.As(err, &e):
		return &Result{Code: int32(Internal), Message: err.Error()}
	case err == error(e):
		return &Result{Code: int32(e.Code), Message: e.detail()}
	}
	return &Result{Code: int32(e.Code), Message: err.Error()}
}

// AsError turns a Result back into an error: nil for OK.
func (r *Result) AsError() error {
	if r == nil || r.Code == int32(OK) {
		return nil
	}
	return &Error{Code: Code(r.Code), Msg: r.Message}
}
