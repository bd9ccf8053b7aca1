package engine

import "github.com/mooncake-go/mooncake/engine/transport"

// Status is the state of a transfer task or batch, numbered as Mooncake's
// TransferStatusEnum.
type Status int32

const (
	Waiting   Status = 0
	Pending   Status = 1
	Invalid   Status = 2
	Canceled  Status = 3
	Completed Status = 4
	Timeout   Status = 5
	Failed    Status = 6
)

func (s Status) String() string {
	switch s {
	case Waiting:
		return "waiting"
	case Pending:
		return "pending"
	case Invalid:
		return "invalid"
	case Canceled:
		return "canceled"
	case Completed:
		return "completed"
	case Timeout:
		return "timeout"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// Done reports whether s is final.
func (s Status) Done() bool { return s >= Invalid }

// TransferStatus is the outcome of a task so far.
type TransferStatus struct {
	Status      Status
	Transferred uint64 // bytes in place
	Err         error  // why it failed, for Invalid/Timeout/Failed
	Checksum    uint32 // CRC-32C of the bytes moved, once Completed (WithChecksum)
}

// Op is the direction of a request.
type Op = transport.Op

// Directions, numbered as Mooncake's opcode.
const (
	Read  = transport.Read
	Write = transport.Write
)

// SegmentID names an opened segment. LocalSegment is this engine's own.
type SegmentID uint64

// LocalSegment is the ID of this engine's own segment, as Mooncake's 0.
const LocalSegment SegmentID = 0

// BatchID names an allocated batch.
type BatchID uint64

// Request is one transfer: Length bytes between local address Local and the
// absolute remote virtual address Remote in Segment.
type Request struct {
	Op      Op
	Local   uintptr
	Segment SegmentID
	Remote  uint64
	Length  uint64
}

// Notify is a message delivered to a peer's engine (Mooncake's NotifyDesc).
type Notify struct {
	Name string `json:"name"`
	Msg  string `json:"notify_msg"`
}
