package store

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
)

// A small RESP2 client, enough for the Redis yardstick: one command per
// call, written through a buffer that large values bypass, and replies read
// straight into the caller's memory, so that a payload is never copied on
// our side beyond what the socket calls do.

// errNil is a nil reply: the key does not exist.
var errNil = errors.New("store: redis: no such key")

// respConn is one connection to a Redis server.
type respConn struct {
	c   net.Conn
	w   *bufio.Writer
	r   *bufio.Reader
	num []byte // scratch for decimal numbers
}

// respBuffer is the size of both buffers: every header of a 128-object
// batch fits, and a value of at least this size goes straight to the socket.
const respBuffer = 64 << 10

func newRespConn(c net.Conn) *respConn {
	return &respConn{c: c, w: bufio.NewWriterSize(c, respBuffer), r: bufio.NewReaderSize(c, respBuffer),
		num: make([]byte, 0, 20)}
}

// header writes a "*n" or "$n" line.
func (rc *respConn) header(kind byte, n int) {
	rc.w.WriteByte(kind)
	rc.num = strconv.AppendInt(rc.num[:0], int64(n), 10)
	rc.w.Write(rc.num)
	rc.w.WriteString("\r\n")
}

// bulk writes one bulk string.
func (rc *respConn) bulk(s []byte) {
	rc.header('$', len(s))
	rc.w.Write(s)
	rc.w.WriteString("\r\n")
}

func (rc *respConn) bulkString(s string) {
	rc.header('$', len(s))
	rc.w.WriteString(s)
	rc.w.WriteString("\r\n")
}

// set sends SET for one key or MSET for several, value i being
// values[i*size:(i+1)*size], and reads the +OK.
func (rc *respConn) set(keys []string, values []byte, size int) error {
	if len(keys) == 1 {
		rc.header('*', 3)
		rc.bulkString("SET")
	} else {
		rc.header('*', 1+2*len(keys))
		rc.bulkString("MSET")
	}
	for i, k := range keys {
		rc.bulkString(k)
		rc.bulk(values[i*size : (i+1)*size])
	}
	if err := rc.w.Flush(); err != nil {
		return err
	}
	return readStatus(rc.r)
}

// get sends GET for one key or MGET for several and reads value i into
// into[i*size:(i+1)*size]; a value of another size is an error.
func (rc *respConn) get(keys []string, into []byte, size int) error {
	if len(keys) == 1 {
		rc.header('*', 2)
		rc.bulkString("GET")
	} else {
		rc.header('*', 1+len(keys))
		rc.bulkString("MGET")
	}
	for _, k := range keys {
		rc.bulkString(k)
	}
	if err := rc.w.Flush(); err != nil {
		return err
	}
	if len(keys) > 1 {
		n, err := readHeader(rc.r, '*')
		if err != nil {
			return err
		}
		if n != len(keys) {
			return fmt.Errorf("store: redis: MGET of %d keys answered %d values", len(keys), n)
		}
	}
	var first error
	for i, k := range keys {
		// Read every value even after a bad one, to keep the stream in step.
		if err := readBulk(rc.r, into[i*size:(i+1)*size]); err != nil {
			if !errors.Is(err, errBadSize) && !errors.Is(err, errNil) {
				return err
			}
			if first == nil {
				first = fmt.Errorf("%w: %s", err, k)
			}
		}
	}
	return first
}

// ping sends PING and reads the +PONG.
func (rc *respConn) ping() error {
	rc.header('*', 1)
	rc.bulkString("PING")
	if err := rc.w.Flush(); err != nil {
		return err
	}
	return readStatus(rc.r)
}

// The reply decoders. Errors other than errNil, errBadSize and a server's
// error reply leave the stream out of step: drop the connection.

// errBadSize is a value of a size other than the one expected.
var errBadSize = errors.New("store: redis: value of unexpected size")

// errProtocol is a reply that is not RESP2 as we use it.
var errProtocol = errors.New("store: redis: protocol error")

// maxLine bounds a reply's header line; longer is a protocol error.
const maxLine = 4096

// line reads one CRLF-terminated line without the CRLF. The slice is valid
// until the next read.
func line(r *bufio.Reader) ([]byte, error) {
	b, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: line longer than %d bytes", errProtocol, r.Size())
		}
		return nil, err
	}
	if len(b) < 3 || b[len(b)-2] != '\r' || len(b) > maxLine {
		return nil, fmt.Errorf("%w: bad line %q", errProtocol, trim(b))
	}
	return b[:len(b)-2], nil
}

// serverError turns a "-ERR ..." line into an error.
func serverError(l []byte) error {
	return fmt.Errorf("store: redis: %s", trim(l[1:]))
}

func trim(b []byte) []byte { return b[:min(len(b), 80)] }

// readStatus reads a "+..." reply.
func readStatus(r *bufio.Reader) error {
	l, err := line(r)
	if err != nil {
		return err
	}
	switch l[0] {
	case '+':
		return nil
	case '-':
		return serverError(l)
	}
	return fmt.Errorf("%w: want a status, got %q", errProtocol, trim(l))
}

// readHeader reads a "*n" or "$n" line (kind) and returns n, -1 for nil.
func readHeader(r *bufio.Reader, kind byte) (int, error) {
	l, err := line(r)
	if err != nil {
		return 0, err
	}
	if l[0] == '-' {
		return 0, serverError(l)
	}
	if l[0] != kind {
		return 0, fmt.Errorf("%w: want %q, got %q", errProtocol, kind, trim(l))
	}
	n, err := strconv.Atoi(string(l[1:]))
	if err != nil || n < -1 {
		return 0, fmt.Errorf("%w: bad length %q", errProtocol, trim(l))
	}
	return n, nil
}

// readBulk reads one bulk string into dst, which it must fill exactly.
func readBulk(r *bufio.Reader, dst []byte) error {
	n, err := readHeader(r, '$')
	if err != nil {
		return err
	}
	if n < 0 {
		return errNil
	}
	bad := n != len(dst)
	if bad {
		if _, err := r.Discard(n); err != nil {
			return err
		}
	} else if _, err := io.ReadFull(r, dst); err != nil {
		return err
	}
	var crlf [2]byte
	if _, err := io.ReadFull(r, crlf[:]); err != nil {
		return err
	}
	if crlf != [2]byte{'\r', '\n'} {
		return fmt.Errorf("%w: bulk string not followed by CRLF", errProtocol)
	}
	if bad {
		return fmt.Errorf("%w: %d bytes, want %d", errBadSize, n, len(dst))
	}
	return nil
}
