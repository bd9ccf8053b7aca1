package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/conn"
)

// ServerConfig configures the serving side of the TCP transport.
type ServerConfig struct {
	// Memory checks and pins every requested range. Required.
	Memory transport.Memory
	// Secret, when set, is required from every connecting peer.
	Secret []byte
	// PayloadTimeout bounds moving one request's payload once its header has
	// arrived. Zero means 30 s (Mooncake's MC_TCP_STATUS_TIMEOUT_SEC).
	PayloadTimeout time.Duration
	// MaxConns caps concurrent connections. Zero means DefaultMaxConns.
	MaxConns int
	// MaxConnsPerPeer caps concurrent connections from one remote IP, so
	// that one peer cannot take every slot. Zero means
	// DefaultMaxConnsPerPeer.
	MaxConnsPerPeer int
	// MaxDrain is the largest rejected WRITE payload the server reads and
	// discards to keep the connection usable; past it the connection closes.
	// Zero means 1 GiB.
	MaxDrain uint64
	// Served, if set, is called after each request with its outcome.
	Served func(op transport.Op, n uint64, err error)
	Logger *slog.Logger
}

// Connection limits of a Server. A connection over one is closed as it is
// accepted and the refusal logged.
const (
	// DefaultMaxConns bounds the connections served at once.
	DefaultMaxConns = 4096
	// DefaultMaxConnsPerPeer bounds those from one IP. Our engines open
	// Config.Lanes (4, at most 64) per peer each; Mooncake's open one per
	// request in flight, or 4 lanes (at most 16) with its connection
	// pool. 1024 leaves room for sixteen engines of 64 lanes on one host.
	DefaultMaxConnsPerPeer = 1024
)

// Server accepts data connections and serves READ/WRITE requests against
// registered memory. Payload moves straight between the socket and that
// memory: no intermediate buffer. Close (from the embedded Listener) cuts
// every connection and waits for their goroutines.
type Server struct {
	cfg ServerConfig
	*conn.Listener
}

// Listen starts a server on addr ("host:port"; port 0 picks one).
func Listen(addr string, cfg ServerConfig) (*Server, error) {
	if cfg.Memory == nil {
		return nil, errors.New("tcp: ServerConfig.Memory is required")
	}
	if cfg.PayloadTimeout == 0 {
		cfg.PayloadTimeout = 30 * time.Second
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerPeer == 0 {
		cfg.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	if cfg.MaxDrain == 0 {
		cfg.MaxDrain = 1 << 30
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen %s: %w", addr, err)
	}
	s := &Server{cfg: cfg}
	s.Listener = conn.ServeLimits(ln, conn.Limits{Total: cfg.MaxConns, PerPeer: cfg.MaxConnsPerPeer}, cfg.Logger, s.serve)
	return s, nil
}

// serve answers one connection's requests until it ends.
func (s *Server) serve(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if err := conn.ServerAuth(c, s.cfg.Secret); err != nil {
		s.cfg.Logger.Warn("tcp: rejected peer", "remote", c.RemoteAddr(), "err", err)
		return
	}
	var hdr [HeaderSize]byte
	var st [StatusSize]byte
	// Headers come through a small buffer, so a header and the start of its
	// payload (one writev on the peer) cost one read; payload bytes past the
	// buffer go straight to registered memory.
	sc := &srvConn{Conn: c, timeout: s.cfg.PayloadTimeout}
	if sys, ok := c.(syscall.Conn); ok {
		sc.rc, _ = sys.SyscallConn()
	}
	sc.br = bufio.NewReaderSize(sc, 4096)
	sc.rd.set, sc.wd.set = c.SetReadDeadline, c.SetWriteDeadline
	for {
		if err := sc.readHeader(hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Debug("tcp: connection ended", "remote", c.RemoteAddr(), "err", err)
			}
			return
		}
		h, err := ParseHeader(hdr[:])
		if err != nil {
			s.cfg.Logger.Warn("tcp: closing connection", "remote", c.RemoteAddr(), "err", err)
			return
		}
		sc.due = time.Now().Add(s.cfg.PayloadTimeout)
		if !s.handle(sc, h, st[:]) {
			sc.flush() // a last rejection
			return
		}
	}
}

// handle serves one request and reports whether the connection stays usable.
func (s *Server) handle(c *srvConn, h Header, st []byte) bool {
	op := transport.Op(h.Op)
	var pin transport.Pinned
	var err error
	if h.Size == 0 {
		err = fmt.Errorf("%w: zero-length request", transport.ErrRejected)
	} else {
		pin, err = s.cfg.Memory.Acquire(h.Addr, h.Size)
	}
	if err != nil {
		s.served(op, 0, err)
		s.cfg.Logger.Warn("tcp: rejected request", "remote", c.RemoteAddr(), "op", op,
			"addr", fmt.Sprintf("%#x", h.Addr), "size", h.Size, "err", err)
		if !h.V2 {
			return false // v1 has no way to say no but hanging up
		}
		if op == transport.Write {
			// The payload follows the header whatever we think of it; read
			// and drop it so the stream stays in step.
			if h.Size > s.cfg.MaxDrain {
				s.writeStatus(c, st, StatusRejected)
				return false
			}
			if c.drain(h.Size) != nil {
				return false
			}
		}
		return s.writeStatus(c, st, StatusRejected)
	}
	if dm, ok := pin.(transport.DeviceMemory); ok {
		return s.handleDevice(c, h, pin, dm, st)
	}
	mem := transport.Bytes(uintptr(h.Addr), h.Size)
	if op == transport.Write {
		err = c.readFull(mem)
		pin.Release()
		s.served(op, h.Size, err)
		if err != nil {
			return false
		}
		if h.V2 {
			return s.writeStatus(c, st, StatusOK)
		}
		return true
	}
	if !h.V2 {
		err = c.write(mem, c.due)
		pin.Release()
		s.served(op, h.Size, err)
		return err == nil
	}
	return s.readBatch(c, h, pin, mem)
}

// stageChunk is the largest piece of device memory staged at once; its
// buffers are reused across requests and connections.
const stageChunk = 1 << 20

var stageBufs = sync.Pool{New: func() any { b := make([]byte, stageChunk); return &b }}

// handleDevice serves a request (pinned, on a GPU) through a host buffer,
// a chunk at a time: the CPU never touches the device bytes. A WRITE whose
// bytes cannot be copied in is refused once its payload is drained; a READ
// whose first chunk cannot be copied out is refused; a later chunk that
// fails cuts the connection, since the answer has begun (the initiator
// sees the slice fail).
func (s *Server) handleDevice(c *srvConn, h Header, pin transport.Pinned, dm transport.DeviceMemory, st []byte) bool {
	defer pin.Release()
	bp := stageBufs.Get().(*[]byte)
	defer stageBufs.Put(bp)
	buf := *bp
	op := transport.Op(h.Op)
	if op == transport.Write {
		var cerr error
		for off := uint64(0); off < h.Size; {
			n := min(h.Size-off, stageChunk)
			if err := c.readFull(buf[:n]); err != nil {
				s.served(op, off, err)
				return false
			}
			if cerr == nil {
				cerr = dm.CopyIn(h.Addr+off, buf[:n])
			}
			off += n
		}
		if cerr != nil {
			err := fmt.Errorf("%w: copy onto the GPU: %v", transport.ErrRejected, cerr)
			s.served(op, 0, err)
			s.cfg.Logger.Warn("tcp: device write failed", "remote", c.RemoteAddr(),
				"addr", fmt.Sprintf("%#x", h.Addr), "size", h.Size, "err", cerr)
			return h.V2 && s.writeStatus(c, st, StatusRejected)
		}
		s.served(op, h.Size, nil)
		return !h.V2 || s.writeStatus(c, st, StatusOK)
	}
	for off := uint64(0); off < h.Size; {
		n := min(h.Size-off, stageChunk)
		if err := dm.CopyOut(buf[:n], h.Addr+off); err != nil {
			err = fmt.Errorf("%w: copy off the GPU: %v", transport.ErrRejected, err)
			s.served(op, off, err)
			s.cfg.Logger.Warn("tcp: device read failed", "remote", c.RemoteAddr(),
				"addr", fmt.Sprintf("%#x", h.Addr), "size", h.Size, "err", err)
			if off == 0 && h.V2 {
				return s.writeStatus(c, st, StatusRejected)
			}
			return false
		}
		if off == 0 && h.V2 {
			c.pending = binary.LittleEndian.AppendUint64(c.pending, StatusOK)
			if !c.flush() {
				s.served(op, 0, net.ErrClosed)
				return false
			}
		}
		if err := c.write(buf[:n], c.due); err != nil {
			s.served(op, off, err)
			return false
		}
		off += n
	}
	s.served(op, h.Size, nil)
	return true
}

// READ answers for requests already buffered go out in one writev: the
// lanes pipeline requests, and small reads would otherwise cost a syscall
// and a wakeup on both sides each.
const (
	maxReadBatch      = 16
	maxReadBatchBytes = 4 << 20
)

// readBatch answers the READ h (already pinned) together with the READs
// that follow it in the read buffer, in order, statuses first.
func (s *Server) readBatch(c *srvConn, h Header, pin transport.Pinned, mem []byte) bool {
	answers := c.answers[:0]
	c.pending = binary.LittleEndian.AppendUint64(c.pending, StatusOK)
	// The statuses are appended to c.pending, which may grow: slice it
	// only once all are in.
	marks := c.marks[:0]
	marks = append(marks, len(c.pending))
	datas := c.datas[:0]
	datas = append(datas, mem)
	answers = append(answers, readAnswer{size: h.Size, pin: pin})
	total := h.Size
	for len(answers) < maxReadBatch && total < maxReadBatchBytes && c.br.Buffered() >= HeaderSize {
		b, _ := c.br.Peek(HeaderSize)
		next, err := ParseHeader(b)
		if err != nil || next.Op != opRead || !next.V2 || next.Size == 0 {
			break // the main loop deals with it
		}
		p, err := s.cfg.Memory.Acquire(next.Addr, next.Size)
		if _, dev := p.(transport.DeviceMemory); dev {
			p.Release()
			break // staged through host memory by the main loop
		}
		c.br.Discard(HeaderSize)
		if err != nil {
			c.pending = binary.LittleEndian.AppendUint64(c.pending, StatusRejected)
			datas = append(datas, nil)
			answers = append(answers, readAnswer{err: err})
		} else {
			c.pending = binary.LittleEndian.AppendUint64(c.pending, StatusOK)
			datas = append(datas, transport.Bytes(uintptr(next.Addr), next.Size))
			answers = append(answers, readAnswer{size: next.Size, pin: p})
			total += next.Size
		}
		marks = append(marks, len(c.pending))
	}
	// Earlier queued statuses, then per answer its status and its data.
	bufs := c.bufs[:0]
	prev := marks[0] - StatusSize
	bufs = append(bufs, c.pending[:prev])
	for i, end := range marks {
		bufs = append(bufs, c.pending[end-StatusSize:end])
		if datas[i] != nil {
			bufs = append(bufs, datas[i])
		}
	}
	c.bufs = bufs
	err := c.writeBufs(bufs)
	c.pending = c.pending[:0]
	for _, a := range answers {
		if a.pin != nil {
			a.pin.Release()
			s.served(transport.Read, a.size, err)
		} else {
			s.served(transport.Read, 0, a.err)
		}
	}
	clear(datas)
	clear(answers)
	clear(c.bufs)
	c.answers, c.marks, c.datas = answers[:0], marks, datas[:0]
	return err == nil
}

// writeStatus queues a status frame; frames go out together before the
// server next waits for input.
func (s *Server) writeStatus(c *srvConn, st []byte, v uint64) bool {
	c.pending = binary.LittleEndian.AppendUint64(c.pending, v)
	return len(c.pending) < 64*StatusSize || c.flush()
}

// srvConn is a served connection with its read buffer and unsent statuses.
type srvConn struct {
	net.Conn
	rc      syscall.RawConn
	br      *bufio.Reader // reads through srvConn.Read
	pending []byte

	// Payload moves within timeout of their request's header (due); the
	// header of the next request may take for ever.
	timeout time.Duration
	due     time.Time
	rd, wd  deadline

	// Scratch for readBatch, reused across batches.
	answers []readAnswer
	marks   []int
	datas   [][]byte
	bufs    net.Buffers
}

// readAnswer is one READ of a batch: pinned memory, or why it was refused.
type readAnswer struct {
	size uint64
	pin  transport.Pinned
	err  error
}

// Read feeds br. While status frames are queued it first tries a read that
// does not wait: if the peer has already sent more requests, their statuses
// can go out together later. Only when the socket is empty, so the peer may
// be waiting on us, are the statuses flushed before waiting for input.
func (c *srvConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 && c.rc != nil {
		var n int
		var rerr error
		if err := c.rc.Read(func(fd uintptr) bool {
			for {
				n, rerr = unix.Read(int(fd), p)
				if rerr != unix.EINTR {
					return true // never park: this is a probe
				}
			}
		}); err != nil {
			return 0, err
		}
		switch {
		case rerr == nil && n > 0:
			return n, nil
		case rerr == nil: // the peer is done sending: answer what it sent
			c.flush()
			return 0, io.EOF
		case rerr != unix.EAGAIN:
			return 0, rerr
		}
		if !c.flush() {
			return 0, net.ErrClosed
		}
	}
	return c.Conn.Read(p)
}

func (c *srvConn) flush() bool {
	if len(c.pending) == 0 {
		return true
	}
	// Statuses of requests already served: their own time from now.
	err := c.write(c.pending, time.Now().Add(c.timeout))
	c.pending = c.pending[:0]
	return err == nil
}

// readHeader reads the next request header, with no deadline: a deadline
// still armed for an earlier payload that passes while the peer is idle is
// cleared, and the read goes on.
func (c *srvConn) readHeader(b []byte) error {
	for {
		n, err := io.ReadFull(c.br, b)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		b = b[n:]
		c.rd.clear()
	}
}

// readFull reads a payload into b before c.due.
func (c *srvConn) readFull(b []byte) error {
	c.rd.arm(c.due)
	for {
		n, err := io.ReadFull(c.br, b)
		if err == nil || !c.rd.resume(err, c.due) {
			return err
		}
		b = b[n:]
	}
}

// drain reads and drops n payload bytes before c.due.
func (c *srvConn) drain(n uint64) error {
	c.rd.arm(c.due)
	for {
		m, err := io.CopyN(io.Discard, c.br, int64(n))
		if err == nil || !c.rd.resume(err, c.due) {
			return err
		}
		n -= uint64(m)
	}
}

// write sends b before due.
func (c *srvConn) write(b []byte, due time.Time) error {
	c.wd.arm(due)
	for {
		n, err := c.Conn.Write(b)
		if err == nil || !c.wd.resume(err, due) {
			return err
		}
		b = b[n:]
	}
}

// writeBufs sends bufs (consuming them) before c.due.
func (c *srvConn) writeBufs(bufs net.Buffers) error {
	c.wd.arm(c.due)
	for {
		_, err := bufs.WriteTo(c.Conn)
		if err == nil || !c.wd.resume(err, c.due) {
			return err
		}
	}
}

func (s *Server) served(op transport.Op, n uint64, err error) {
	if s.cfg.Served != nil {
		s.cfg.Served(op, n, err)
	}
}
