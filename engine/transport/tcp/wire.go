package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format of Mooncake's TCP transport, protocol version 2.
//
// Every request is a 24-byte header: u64 size, u64 addr (both little-endian)
// and one opcode byte followed by 7 bytes of padding (the C struct is not
// packed). Opcode 0 is READ, 1 is WRITE; bit 0x80 marks version 2.
//
// WRITE: the header is followed by size payload bytes; a v2 server answers
// with one 8-byte status frame only after the payload is in its memory.
// READ: a v2 server answers with a status frame and, when it says OK, size
// bytes of payload. Status frames are u64 little-endian "MCTV"<<32 | code.
// A connection carries any number of requests, one after another.
const (
	HeaderSize = 24
	StatusSize = 8

	opRead  = 0
	opWrite = 1
	opV2    = 0x80

	statusMagic    = uint64(0x4D435456) << 32
	StatusOK       = statusMagic // code 0
	StatusRejected = statusMagic | 1
)

// Header is one decoded request header.
type Header struct {
	Size uint64
	Addr uint64
	Op   uint8 // opRead or opWrite, version bit stripped
	V2   bool
}

// ErrMalformed: bytes from the network that are not a valid frame.
var ErrMalformed = errors.New("tcp: malformed frame")

// PutHeader encodes h into b[:HeaderSize].
func PutHeader(b []byte, h Header) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint64(b[0:], h.Size)
	binary.LittleEndian.PutUint64(b[8:], h.Addr)
	op := h.Op
	if h.V2 {
		op |= opV2
	}
	b[16] = op
	clear(b[17:HeaderSize])
}

// ParseHeader decodes a request header. It rejects unknown opcodes and
// ranges that wrap the address space; padding bytes are ignored, as the
// reference implementation leaves them uninitialised.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: header of %d bytes", ErrMalformed, len(b))
	}
	h := Header{
		Size: binary.LittleEndian.Uint64(b[0:]),
		Addr: binary.LittleEndian.Uint64(b[8:]),
		Op:   b[16] &^ opV2,
		V2:   b[16]&opV2 != 0,
	}
	if h.Op != opRead && h.Op != opWrite {
		return Header{}, fmt.Errorf("%w: opcode %#x", ErrMalformed, b[16])
	}
	if h.Addr+h.Size < h.Addr {
		return Header{}, fmt.Errorf("%w: range %#x+%d wraps", ErrMalformed, h.Addr, h.Size)
	}
	return h, nil
}

// ParseStatus decodes a v2 status frame: nil for OK, ErrRejected-wrapping
// errors for a rejection, ErrMalformed for anything else.
func ParseStatus(b []byte) (ok bool, err error) {
	if len(b) < StatusSize {
		return false, fmt.Errorf("%w: status of %d bytes", ErrMalformed, len(b))
	}
	switch v := binary.LittleEndian.Uint64(b); v {
	case StatusOK:
		return true, nil
	case StatusRejected:
		return false, nil
	default:
		return false, fmt.Errorf("%w: status frame %#016x", ErrMalformed, v)
	}
}
