// Package transport defines what the engine asks of a data path: open a
// peer, move one contiguous slice between local memory and that peer's
// memory, and call back exactly once when the bytes are in place (or the
// slice failed).
//
// The engine drives every path through the interfaces here and nothing
// else: Transport opens a Peer per opened segment, Peer takes slices. A
// path may offer more through optional interfaces, which the engine finds
// by type assertion (the way hashicorp/raft finds a pipelining transport):
// Inliner, a peer that can send from the submitter's goroutine and let it
// read the answers; Publisher, a transport that adds to this engine's own
// segment descriptor what its peers need to reach it.
//
// Implementations live in subpackages: tcp (Mooncake TE v2 wire format),
// shm (same-host shared memory and process_vm_readv/writev) and
// transporttest (an in-memory fake for tests). They import this package;
// the engine imports them; nothing here imports the engine. A new data path
// (GPU staging, CUDA IPC, RDMA) is a new subpackage implementing Transport,
// handed to the engine in its Config.
package transport

import (
	"context"
	"errors"
	"time"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine/metadata"
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

	// LocalDevice is 1 + the CUDA ordinal of the GPU that holds Local's
	// bytes; 0, the zero value, is host memory. The CPU must not touch
	// device memory: a path that cannot move it leaves such a slice to
	// another (the staging path stages it through host memory).
	LocalDevice int
	// Checksum asks for the CRC-32C of the slice's bytes, taken by the
	// path that holds them in host memory when the engine may not read
	// them itself (device memory): it sets CRC and Summed. For host
	// memory a path may take it where it reads the bytes anyway (a TCP
	// send); else the engine sums them once the slice is done.
	Checksum bool
	CRC      uint32
	Summed   bool

	// Done reports the outcome: nil once the bytes are in place. It must not
	// block: transports call it from their I/O goroutines.
	Done func(s *Slice, err error)
}

// OnDevice reports the GPU holding s's local bytes, if any.
func (s *Slice) OnDevice() (dev int, ok bool) { return s.LocalDevice - 1, s.LocalDevice > 0 }

// Transport is one data path: it opens peers and moves their slices.
//
// The engine holds its transports in order of preference (same-host before
// TCP). When it opens a segment it offers the peer to each, last first, and
// hands every one the peer it opened on the path after it (PeerInfo.Next):
// a path that cannot serve a slice passes it on rather than failing it.
// Slices go to the first path that opened.
type Transport interface {
	// Name is the label used in metrics and logs ("tcp", "shm").
	Name() string
	// Open prepares the path to a peer. An error wrapping ErrUnavailable
	// says this path does not reach that peer (another host, no TCP address)
	// and is not a failure; any other error fails the opening of the
	// segment. ctx bounds the opening, not the peer's life.
	Open(ctx context.Context, info PeerInfo) (Peer, error)
	// Close stops the transport and waits for its goroutines; slices still in
	// flight are failed with ErrClosed, and so are later submissions.
	Close() error
}

// PeerInfo is what the engine knows of a peer when it opens its segment.
type PeerInfo struct {
	// Name is the segment name.
	Name string
	// Desc is the peer's descriptor as published (or as the peer answered
	// in P2PHANDSHAKE mode). Transports read it; they never change it.
	Desc *metadata.SegmentDesc
	// Addrs are the addresses of the peer's TCP data port, in order of
	// preference: the one its descriptor names first, then any others it
	// publishes (a host with several NICs). A transport spreads over them
	// and moves on to the next when one fails.
	Addrs []string
	// Describe asks the peer for its descriptor as it is now, over the
	// handshake socket; paths that keep a view of the peer's memory refresh
	// it with this.
	Describe func(ctx context.Context) (*metadata.SegmentDesc, error)
	// Next is the peer on the path after this one, nil if there is none:
	// where a slice goes that this path cannot serve. It is the engine's
	// to close, not the transport's.
	Next Peer
}

// Peer is one opened peer on one path.
type Peer interface {
	// Submit takes s; s.Done is called exactly once, maybe before Submit
	// returns. Submit may block while the peer's queue is full, never past
	// s.Deadline nor after ctx ends (then s fails with ErrTimeout or ctx's
	// error). ctx bounds only the wait to be admitted, not the transfer.
	Submit(ctx context.Context, s *Slice)
	// Path names the path a slice submitted now takes, for metrics: the
	// transport's name, or the next path's once this one gave up on the
	// peer.
	Path() string
	// Close releases the peer; its slices still in flight fail with
	// ErrClosed. It does not close Next.
	Close()
}

// Inliner is implemented by a Peer that can send a few slices from the
// submitter's goroutine, leaving their answers to be read there too, so
// that a small transfer to an idle peer involves no goroutine hand-off.
type Inliner interface {
	// SubmitInline submits sl, all to this peer, in order. When it takes
	// them inline it returns their Inline, which the caller must Wait on or
	// Release; otherwise it submits them as Submit does (ctx as there) and
	// returns nil.
	SubmitInline(ctx context.Context, sl []*Slice) Inline
}

// Inline is slices an Inliner sent from the submitter's goroutine.
type Inline interface {
	// Wait reads their answers in the calling goroutine until every slice
	// is settled or ctx ends; then it releases the rest.
	Wait(ctx context.Context)
	// Release leaves their answers to the transport's own goroutines.
	Release()
}

// Publisher is implemented by a Transport whose peers need more of this
// engine's segment descriptor than its TCP fields and buffer list (the
// same-host path publishes its process identity and memfds).
type Publisher interface {
	// Publish adds the transport's part to d, in two steps: Publish itself
	// reads what must be read before the regions are listed (a generation
	// counter that Unregistered moves) and returns a function that the
	// engine calls, once every publisher has done that, with this engine's
	// remote-accessible registered memory in registration order.
	Publish(d *metadata.SegmentDesc) func(regions []LocalRegion)
	// Unregistered says a region was just removed, before the descriptor is
	// published again.
	Unregistered()
}

// LocalRegion is a remote-accessible region of this engine's memory.
type LocalRegion struct {
	Addr, Length uint64
	// FD is the memfd behind the region (AllocateBuffer), or -1.
	FD int
	// Device is 1 + the CUDA ordinal of the GPU holding the region; 0,
	// the zero value, is host memory.
	Device int
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
	// ErrUnavailable: this path does not reach the peer; the next one may.
	ErrUnavailable = errors.New("transport: peer not reachable on this path")
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

// DeviceMemory is implemented by a Pinned region in GPU memory, which the
// CPU must not touch: a transport serving it moves its bytes through a
// host buffer of its own with these.
type DeviceMemory interface {
	// CopyOut copies len(dst) bytes at addr into dst.
	CopyOut(dst []byte, addr uint64) error
	// CopyIn copies src to addr.
	CopyIn(addr uint64, src []byte) error
}
