package store

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The wire of the tcp floor (TCPServer), one request then one reply at a
// time on a connection.
//
// Request, client to server: an op byte (tcpGet or tcpPut), u32 value size,
// u32 count, then count keys, each a u16 length and its bytes; a put's
// values follow, count times the value size, in the order of the keys.
//
// Reply: tcpValues then the values of a get, in the order of its keys;
// tcpAck for a put; or tcpError, a u16 length and a message. A request the
// server cannot decode is answered with an error and the connection closed,
// since the stream can no longer be followed.
const (
	tcpGet    = 'G'
	tcpPut    = 'P'
	tcpValues = 'V'
	tcpAck    = 'K'
	tcpError  = 'E'

	tcpHeader = 9
	// tcpMaxKey bounds a key's length, so that a bad length cannot make
	// the server read or allocate much before it fails.
	tcpMaxKey = 1024
)

// tcpRequest is one decoded request; its keys slice is reused.
type tcpRequest struct {
	op    byte
	size  int // value size
	keys  []string
	names []byte // the keys' bytes, reused
	ends  []int  // where each key ends in names, reused
}

// tcpLimits are what a server accepts.
type tcpLimits struct {
	valueSize int // every value is exactly this size
	maxCount  int // the most keys in one request
}

// readTCPRequest decodes the header and keys of one request from r into
// req; a put's values are left in r. It returns io.EOF at a clean end of
// the stream and an error naming what is wrong with a malformed request.
func readTCPRequest(r *bufio.Reader, lim tcpLimits, req *tcpRequest) error {
	var h [tcpHeader]byte
	if _, err := io.ReadFull(r, h[:1]); err != nil {
		return err // io.EOF between requests
	}
	if _, err := io.ReadFull(r, h[1:]); err != nil {
		return fmt.Errorf("request header: %w", unexpected(err))
	}
	req.op = h[0]
	if req.op != tcpGet && req.op != tcpPut {
		return fmt.Errorf("request op %q (want %q or %q)", req.op, tcpGet, tcpPut)
	}
	size, count := binary.LittleEndian.Uint32(h[1:]), binary.LittleEndian.Uint32(h[5:])
	if int64(size) != int64(lim.valueSize) {
		return fmt.Errorf("value size %d, the server holds %d-byte values", size, lim.valueSize)
	}
	if count == 0 || int64(count) > int64(lim.maxCount) {
		return fmt.Errorf("%d keys in a request (want 1 to %d)", count, lim.maxCount)
	}
	req.size = int(size)
	req.keys, req.names, req.ends = req.keys[:0], req.names[:0], req.ends[:0]
	for i := range int(count) {
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return fmt.Errorf("key %d: %w", i, unexpected(err))
		}
		n := int(binary.LittleEndian.Uint16(l[:]))
		if n == 0 || n > tcpMaxKey {
			return fmt.Errorf("key %d: length %d (want 1 to %d)", i, n, tcpMaxKey)
		}
		start := len(req.names)
		req.names = append(req.names, make([]byte, n)...)
		if _, err := io.ReadFull(r, req.names[start:]); err != nil {
			return fmt.Errorf("key %d: %w", i, unexpected(err))
		}
		req.ends = append(req.ends, len(req.names))
	}
	// Strings only once the bytes stop moving.
	start := 0
	for _, end := range req.ends {
		req.keys = append(req.keys, string(req.names[start:end]))
		start = end
	}
	return nil
}

// appendTCPRequest appends the header and keys of a request.
func appendTCPRequest(b []byte, op byte, size int, keys []string) []byte {
	b = append(b, op)
	b = binary.LittleEndian.AppendUint32(b, uint32(size))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(keys)))
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
	}
	return b
}

// appendTCPError appends an error reply, its message cut to fit.
func appendTCPError(b []byte, err error) []byte {
	msg := err.Error()
	if len(msg) > 1<<16-1 {
		msg = msg[:1<<16-1]
	}
	b = append(b, tcpError)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// readTCPReply reads a reply's first byte and returns nil if it is want,
// the server's message if it is an error, and an error otherwise.
func readTCPReply(r io.Reader, want byte) error {
	var b [3]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return fmt.Errorf("reply: %w", unexpected(err))
	}
	switch b[0] {
	case want:
		return nil
	case tcpError:
		if _, err := io.ReadFull(r, b[1:]); err != nil {
			return fmt.Errorf("error reply: %w", unexpected(err))
		}
		msg := make([]byte, binary.LittleEndian.Uint16(b[1:]))
		if _, err := io.ReadFull(r, msg); err != nil {
			return fmt.Errorf("error reply: %w", unexpected(err))
		}
		return fmt.Errorf("tcp server: %s", msg)
	default:
		return fmt.Errorf("reply starts with %q (want %q or %q)", b[0], want, tcpError)
	}
}

// unexpected turns an EOF inside a message into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
