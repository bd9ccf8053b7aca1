package metadata

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/mooncake-go/mooncake/engine/transport/conn"
)

// The handshake socket carries Mooncake's control messages, one request and
// one reply per connection. A frame is a u64 length in host byte order
// (little-endian on every platform Mooncake ships for), counting what
// follows; one type byte; then JSON. A first byte above 3 marks the legacy
// untyped format, where the JSON starts right after the length.
const (
	TypeConnection byte = 0 // RDMA queue-pair exchange
	TypeMetadata   byte = 1 // segment descriptor exchange (P2PHANDSHAKE)
	TypeNotify     byte = 2 // {name, notify_msg}
	TypeProbe      byte = 3 // liveness

	// DefaultMaxFrame is Mooncake's MC_HANDSHAKE_MAX_LENGTH default.
	DefaultMaxFrame = 1 << 20
)

// ErrFrame: bytes on the handshake socket that are not a valid frame.
var ErrFrame = errors.New("metadata: malformed handshake frame")

// WriteFrame writes one typed frame.
func WriteFrame(w io.Writer, typ byte, body []byte) error {
	buf := make([]byte, 9+len(body))
	binary.LittleEndian.PutUint64(buf, uint64(1+len(body)))
	buf[8] = typ
	copy(buf[9:], body)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one frame of at most max bytes (type byte included).
func ReadFrame(r io.Reader, max int) (typ byte, body []byte, err error) {
	var lb [8]byte
	if _, err := io.ReadFull(r, lb[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n == 0 || n > uint64(max) {
		return 0, nil, fmt.Errorf("%w: length %d (limit %d)", ErrFrame, n, max)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrFrame, err)
	}
	if buf[0] > TypeProbe {
		return TypeConnection, buf, nil // legacy: no type byte
	}
	return buf[0], buf[1:], nil
}

// Handler answers handshake requests. The reply goes back with the
// request's type byte. An error closes the connection without a reply.
type Handler func(typ byte, body []byte, remote net.Addr) ([]byte, error)

// Connection limits of a HandshakeServer. Each connection carries one
// request and lives seconds at most: generous caps still bound a flood,
// and one peer cannot take every slot. A connection over one is closed as
// it is accepted, and the refusal logged.
const (
	HandshakeMaxConns        = 1024
	HandshakeMaxConnsPerPeer = 256
)

// HandshakeServer accepts handshake connections.
type HandshakeServer struct {
	*conn.Listener
	handler Handler
	secret  []byte
	max     int
	log     *slog.Logger
}

// ServeHandshake listens on addr and answers requests with h.
func ServeHandshake(addr string, h Handler, secret []byte, log *slog.Logger) (*HandshakeServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metadata: handshake listen %s: %w", addr, err)
	}
	return NewHandshakeServer(ln, h, secret, log), nil
}

// NewHandshakeServer serves on an existing listener (taking ownership).
func NewHandshakeServer(ln net.Listener, h Handler, secret []byte, log *slog.Logger) *HandshakeServer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &HandshakeServer{handler: h, secret: secret, max: DefaultMaxFrame, log: log}
	s.Listener = conn.ServeLimits(ln, conn.Limits{Total: HandshakeMaxConns, PerPeer: HandshakeMaxConnsPerPeer}, log, s.serve)
	return s
}

// serve answers the one request of a connection.
func (s *HandshakeServer) serve(c net.Conn) {
	if err := conn.ServerAuth(c, s.secret); err != nil {
		s.log.Warn("handshake: rejected peer", "remote", c.RemoteAddr(), "err", err)
		return
	}
	// Mooncake's daemon gives a request 5 s to arrive.
	c.SetDeadline(time.Now().Add(5 * time.Second))
	typ, body, err := ReadFrame(c, s.max)
	if err != nil {
		s.log.Warn("handshake: bad request", "remote", c.RemoteAddr(), "err", err)
		return
	}
	reply, err := s.handler(typ, body, c.RemoteAddr())
	if err != nil {
		s.log.Warn("handshake: request refused", "remote", c.RemoteAddr(), "type", typ, "err", err)
		return
	}
	if err := WriteFrame(c, typ, reply); err != nil {
		return
	}
	// Half-close and wait for the client to hang up, as Mooncake does, so
	// the reply is never cut off by a reset.
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 1<<16))
}

// Call sends one request to the handshake server at addr and returns the
// reply body. The context bounds the whole exchange (Mooncake: 5 s connect,
// 60 s receive).
func Call(ctx context.Context, addr string, typ byte, body []byte, secret []byte) ([]byte, error) {
	reply, err := call(ctx, addr, typ, body, secret)
	if err == nil {
		return reply, nil
	}
	// A call its context ended fails on the socket deadline that ctx set,
	// an i/o timeout; keep ctx's error in the chain so that callers can
	// test errors.Is(err, context.Canceled) or DeadlineExceeded. The socket
	// deadline may pass a moment before ctx's timer fires.
	cerr := ctx.Err()
	if d, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(d) && errors.Is(err, os.ErrDeadlineExceeded) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", cerr, err)
	}
	return nil, err
}

func call(ctx context.Context, addr string, typ byte, body []byte, secret []byte) ([]byte, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metadata: handshake dial %s: %w", addr, err)
	}
	defer c.Close()
	deadline := time.Now().Add(60 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if err := conn.ClientAuth(c, secret); err != nil {
		return nil, fmt.Errorf("metadata: handshake with %s: %w", addr, err)
	}
	if err := WriteFrame(c, typ, body); err != nil {
		return nil, fmt.Errorf("metadata: handshake send to %s: %w", addr, err)
	}
	rtyp, reply, err := ReadFrame(c, DefaultMaxFrame)
	if err != nil {
		return nil, fmt.Errorf("metadata: handshake reply from %s: %w", addr, err)
	}
	if rtyp != typ {
		return nil, fmt.Errorf("%w: reply type %d to request type %d", ErrFrame, rtyp, typ)
	}
	return reply, nil
}
