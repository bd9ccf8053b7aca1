package framerpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"google.golang.org/grpc/metadata"
)

// Preface opens a framed connection; the server echoes it. It is as long
// as what the server reads to tell the two protocols apart, and no
// HTTP/2 connection starts with it ("PRI * HTTP/2.0...").
const Preface = "MCFRAME1"

const (
	lenSize = 4
	// callHead is a call's fixed header after its length: id, timeout.
	callHead = 8 + 8
	// answerHead is an answer's header after its length: id, kind.
	answerHead = 8 + 1

	answerOK     = 0
	answerStatus = 1

	// maxMetadata bounds a call's metadata pairs and their bytes: what
	// gRPC's default header list allows (16 KiB) is far above what the
	// master's callers send (a token, a tenant).
	maxMetadata      = 64
	maxMetadataBytes = 16 << 10
)

// ErrMalformed marks a frame that does not decode.
var ErrMalformed = errors.New("framerpc: malformed frame")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// call is a decoded call frame.
type call struct {
	id      uint64
	timeout time.Duration // 0: none
	method  string
	md      metadata.MD
	msg     []byte // aliases the frame
}

// appendCall appends the frame of a call with msg (the request message,
// marshaled) to b.
func appendCall(b []byte, id uint64, timeout time.Duration, method string, md metadata.MD, msg []byte) ([]byte, error) {
	if len(method) > math.MaxUint16 {
		return nil, fmt.Errorf("framerpc: method name of %d bytes", len(method))
	}
	pairs, mdBytes := 0, 0
	for k, vs := range md {
		pairs += len(vs)
		for _, v := range vs {
			mdBytes += len(k) + len(v)
		}
	}
	if pairs > maxMetadata || mdBytes > maxMetadataBytes {
		return nil, fmt.Errorf("framerpc: %d metadata pairs of %d bytes, over the limit of %d pairs, %d bytes",
			pairs, mdBytes, maxMetadata, maxMetadataBytes)
	}
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, 0) // the length, set below
	b = binary.LittleEndian.AppendUint64(b, id)
	b = binary.LittleEndian.AppendUint64(b, uint64(max(timeout, 0)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(method)))
	b = append(b, method...)
	b = binary.LittleEndian.AppendUint16(b, uint16(pairs))
	for k, vs := range md {
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
			b = append(b, k...)
			b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	}
	b = append(b, msg...)
	n := len(b) - start - lenSize
	if n > math.MaxUint32 {
		return nil, fmt.Errorf("framerpc: call of %d bytes", n)
	}
	binary.LittleEndian.PutUint32(b[start:], uint32(n))
	return b, nil
}

// parseCall decodes the body of a call frame (what follows its length).
func parseCall(body []byte) (call, error) {
	var c call
	if len(body) < callHead+2 {
		return c, malformed("call of %d bytes, under its %d-byte header", len(body), callHead+2)
	}
	c.id = binary.LittleEndian.Uint64(body)
	t := binary.LittleEndian.Uint64(body[8:])
	if t > math.MaxInt64 {
		return c, malformed("timeout of %d ns", t)
	}
	c.timeout = time.Duration(t)
	r := reader{b: body[callHead:]}
	c.method = string(r.bytes(int(r.u16())))
	pairs := int(r.u16())
	if r.err == nil && pairs > maxMetadata {
		return c, malformed("%d metadata pairs, over the limit of %d", pairs, maxMetadata)
	}
	if pairs > 0 {
		c.md = make(metadata.MD, pairs)
	}
	mdBytes := 0
	for range pairs {
		k := string(r.bytes(int(r.u16())))
		v := r.bytes(int(r.u32()))
		if r.err != nil {
			break
		}
		if mdBytes += len(k) + len(v); mdBytes > maxMetadataBytes {
			return c, malformed("metadata over %d bytes", maxMetadataBytes)
		}
		c.md[k] = append(c.md[k], string(v))
	}
	if r.err != nil {
		return c, r.err
	}
	if c.method == "" {
		return c, malformed("call without a method")
	}
	c.msg = r.b
	return c, nil
}

// appendAnswer appends the header of an answer to call id whose kind
// (answerOK, answerStatus) is followed by n bytes of message to b.
func appendAnswer(b []byte, id uint64, kind byte, n int) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(answerHead+n))
	b = binary.LittleEndian.AppendUint64(b, id)
	return append(b, kind)
}

// parseAnswer decodes the body of an answer frame.
func parseAnswer(body []byte) (id uint64, kind byte, msg []byte, err error) {
	if len(body) < answerHead {
		return 0, 0, nil, malformed("answer of %d bytes, under its %d-byte header", len(body), answerHead)
	}
	id, kind = binary.LittleEndian.Uint64(body), body[8]
	if kind != answerOK && kind != answerStatus {
		return 0, 0, nil, malformed("answer of kind %d", kind)
	}
	return id, kind, body[answerHead:], nil
}

// readFrame reads one frame's body into buf (grown as needed) from r: a
// frame of more than limit bytes is not read (ErrTooLarge, with its
// length; the caller decides whether to skip it).
func readFrame(r io.Reader, buf []byte, limit int) ([]byte, error) {
	var l [lenSize]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return buf, err
	}
	n := int(binary.LittleEndian.Uint32(l[:]))
	if n > limit {
		return buf, &TooLargeError{Size: n, Limit: limit}
	}
	// The length is the peer's word until its bytes arrive: a frame
	// larger than the buffer grows it as they do (doubling, from
	// readChunk), as gRPC reads a message, so that a peer claiming the
	// limit and sending 4 bytes holds no more than that.
	buf = buf[:0]
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(n-len(buf), max(len(buf), readChunk)))
		}
		m, err := io.ReadFull(r, buf[len(buf):min(n, cap(buf))])
		buf = buf[:len(buf)+m]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return buf, err
		}
	}
	return buf, nil
}

// readChunk is the most readFrame allocates ahead of the bytes it has.
const readChunk = 1 << 20

// TooLargeError is a frame over the reader's limit.
type TooLargeError struct{ Size, Limit int }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("framerpc: frame of %d bytes, over the limit of %d", e.Size, e.Limit)
}

// reader decodes fields from b; the first short field sets err and every
// later one reads as zero.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = malformed("field of %d bytes past the frame's end (%d left)", n, len(r.b))
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *reader) bytes(n int) []byte { return r.take(n) }
