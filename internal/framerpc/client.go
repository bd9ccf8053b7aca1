package framerpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/internal/pathwatch"
)

// ConnConfig configures a Conn.
type ConnConfig struct {
	// Addr is the server's host:port.
	Addr string
	// GRPC carries streams, and every call once the server turned out not
	// to speak framerpc, or a call given grpc.CallOptions. Required.
	GRPC grpc.ClientConnInterface
	// Creds add their metadata to every call, as grpc.WithPerRPCCredentials
	// does. Without TLS, only those that do not require transport security:
	// the frames then go in plaintext.
	Creds []credentials.PerRPCCredentials
	// TLS, when set, wraps the connection (a server's SplitTLS listener):
	// its ServerName, when empty, is Addr's host; its NextProtos are ALPN's.
	// A server that does not complete that handshake gets gRPC (GRPC must
	// speak TLS too), for Reprobe. Nil: plaintext.
	TLS *tls.Config
	// MaxRecvMsgSize and MaxSendMsgSize bound a reply and a request. Zero:
	// 256 MiB.
	MaxRecvMsgSize, MaxSendMsgSize int
	// DialTimeout bounds a connect and its preface. Zero: 2 s.
	DialTimeout time.Duration
	// Reprobe is how long the Conn keeps to gRPC after its server did not
	// answer the preface, before it tries frames again: the server may
	// have been one without framerpc that was upgraded, or one that was
	// only slow to answer. Zero: 1 minute.
	Reprobe time.Duration
	// PathTimeout is how long the connection may go without the server's
	// kernel acknowledging what was sent, or answering a keepalive, before
	// it counts as lost (its calls fail with codes.Unavailable): a
	// partition, not a dead process, which the peer's kernel would report
	// at once. Zero: 13 s, what gRPC's keepalive of the master's clients
	// takes (a ping after 10 s, 3 s for its answer).
	PathTimeout time.Duration
}

// Conn sends unary calls as frames over one connection, dialed on the
// first call and again after one is lost.
type Conn struct {
	cfg      ConnConfig
	fellBack atomic.Int64  // UnixNano when the server was found not to speak framerpc; 0: never
	calls    atomic.Uint64 // sent as frames

	mu     sync.Mutex
	wire   *wire // nil: none yet, or the last one was lost
	dialed chan struct{}
	closed bool
}

var _ grpc.ClientConnInterface = (*Conn)(nil)

// errNotFramed is a server that did not answer the preface.
var errNotFramed = errors.New("framerpc: the server does not speak framerpc")

// NewConn returns a Conn; it dials nothing yet.
func NewConn(cfg ConnConfig) *Conn {
	if cfg.MaxRecvMsgSize <= 0 {
		cfg.MaxRecvMsgSize = 256 << 20
	}
	if cfg.MaxSendMsgSize <= 0 {
		cfg.MaxSendMsgSize = 256 << 20
	}
	// A frame's length is a u32: a larger limit is none, and must not
	// overflow the frame's limit, which adds the header to it.
	cfg.MaxRecvMsgSize = min(cfg.MaxRecvMsgSize, math.MaxUint32)
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	if cfg.Reprobe <= 0 {
		cfg.Reprobe = time.Minute
	}
	if cfg.PathTimeout <= 0 {
		cfg.PathTimeout = 13 * time.Second
	}
	if cfg.TLS != nil {
		cfg.TLS = cfg.TLS.Clone()
		cfg.TLS.NextProtos = []string{ALPN}
		if cfg.TLS.ServerName == "" {
			cfg.TLS.ServerName, _, _ = net.SplitHostPort(cfg.Addr)
		}
	}
	return &Conn{cfg: cfg}
}

// Framed reports whether calls go as frames: the server was not found,
// within Reprobe, not to speak framerpc.
func (c *Conn) Framed() bool { return !c.fallback() }

// fallback reports whether calls go over gRPC for now.
func (c *Conn) fallback() bool {
	at := c.fellBack.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < c.cfg.Reprobe
}

// Calls is how many calls were sent as frames.
func (c *Conn) Calls() uint64 { return c.calls.Load() }

// NewStream opens a stream over gRPC.
func (c *Conn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.cfg.GRPC.NewStream(ctx, desc, method, opts...)
}

// Invoke sends a unary call and waits for its answer, which it decodes
// into reply; errors are gRPC statuses, as grpc.ClientConn's.
func (c *Conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	req, ok1 := args.(proto.Message)
	rep, ok2 := reply.(proto.Message)
	if !plain(opts) || !ok1 || !ok2 || c.fallback() {
		return c.cfg.GRPC.Invoke(ctx, method, args, reply, opts...)
	}
	if err := ctx.Err(); err != nil {
		// As gRPC: a call whose context is over is not sent, and says
		// nothing of the connection.
		return grpcstatus.FromContextError(err).Err()
	}
	w, err := c.get(ctx)
	if errors.Is(err, errNotFramed) {
		return c.cfg.GRPC.Invoke(ctx, method, args, reply, opts...)
	}
	if err != nil {
		return err
	}
	md, err := c.metadata(ctx, method)
	if err != nil {
		return err
	}
	var timeout time.Duration
	if d, ok := ctx.Deadline(); ok {
		if timeout = time.Until(d); timeout <= 0 {
			return grpcstatus.FromContextError(context.DeadlineExceeded).Err()
		}
	}
	if n := proto.Size(req); n > c.cfg.MaxSendMsgSize {
		return grpcstatus.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", n, c.cfg.MaxSendMsgSize)
	}
	fb := getFrame()
	msg, err := proto.MarshalOptions{}.MarshalAppend(fb.b, req)
	if err != nil {
		return grpcstatus.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	c.calls.Add(1)
	a, err := w.call(ctx, method, timeout, md, msg)
	putFrame(fb, msg) // copied into the frame sent, if any
	if a.buf != nil {
		// Decoded (copied) below, then recycled.
		defer putFrame(a.buf, a.buf.b)
	}
	if err != nil {
		if w.lost() {
			c.forget(w)
		}
		return err
	}
	if a.kind == answerStatus {
		var sp status.Status
		if err := proto.Unmarshal(a.msg, &sp); err != nil {
			return grpcstatus.Errorf(codes.Internal, "framerpc: undecodable status from %s: %v", c.cfg.Addr, err)
		}
		if sp.Code == int32(codes.OK) {
			return grpcstatus.Errorf(codes.Internal, "framerpc: status OK as an error from %s", c.cfg.Addr)
		}
		return grpcstatus.ErrorProto(&sp)
	}
	if err := proto.Unmarshal(a.msg, rep); err != nil {
		return grpcstatus.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
	return nil
}

// plain reports whether opts change nothing a frame would need to carry:
// none but the mark generated clients put on every call.
func plain(opts []grpc.CallOption) bool {
	for _, o := range opts {
		if _, ok := o.(grpc.StaticMethodCallOption); !ok {
			return false
		}
	}
	return true
}

// metadata is what a call carries: the context's outgoing metadata and
// the credentials'.
func (c *Conn) metadata(ctx context.Context, method string) (metadata.MD, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	if len(c.cfg.Creds) == 0 {
		return md, nil
	}
	md = md.Copy()
	for _, cr := range c.cfg.Creds {
		m, err := cr.GetRequestMetadata(ctx, "framerpc://"+c.cfg.Addr+method)
		if err != nil {
			return nil, grpcstatus.Errorf(codes.Unauthenticated, "framerpc: credentials: %v", err)
		}
		for k, v := range m {
			md.Append(k, v)
		}
	}
	return md, nil
}

// get returns the connection, dialing one if there is none; calls that
// arrive meanwhile wait for that dial.
func (c *Conn) get(ctx context.Context) (*wire, error) {
	for {
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return nil, grpcstatus.Error(codes.Canceled, "grpc: the client connection is closing")
		case c.fallback():
			// The dial this call waited on found gRPC: so does the call.
			c.mu.Unlock()
			return nil, errNotFramed
		case c.wire != nil && !c.wire.lost():
			w := c.wire
			c.mu.Unlock()
			return w, nil
		case c.dialed != nil:
			ch := c.dialed
			c.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, grpcstatus.FromContextError(ctx.Err()).Err()
			}
		}
		ch := make(chan struct{})
		c.dialed = ch
		c.mu.Unlock()
		w, err := c.dial(ctx)
		c.mu.Lock()
		if errors.Is(err, errNotFramed) {
			c.fellBack.Store(time.Now().UnixNano()) // before the calls waiting look
		}
		c.dialed = nil
		close(ch)
		if err == nil && c.closed {
			w.close(errors.New("framerpc: connection closed"))
			err = grpcstatus.Error(codes.Canceled, "grpc: the client connection is closing")
		}
		if err == nil {
			c.wire = w
		}
		c.mu.Unlock()
		return w, err
	}
}

func (c *Conn) dial(ctx context.Context) (*wire, error) {
	dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	nc, err := c.dialer().DialContext(dctx, "tcp", c.cfg.Addr)
	switch {
	case err != nil && ctxDone(ctx) != nil:
		return nil, grpcstatus.FromContextError(ctxDone(ctx)).Err()
	case err != nil:
		return nil, grpcstatus.Errorf(codes.Unavailable, "framerpc: dial %s: %v", c.cfg.Addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	d, _ := dctx.Deadline()
	_ = nc.SetDeadline(d)
	if c.cfg.TLS != nil {
		tc := tls.Client(nc, c.cfg.TLS)
		if err := tc.HandshakeContext(dctx); err != nil {
			_ = nc.Close()
			if ctxDone(ctx) != nil {
				return nil, grpcstatus.FromContextError(ctxDone(ctx)).Err()
			}
			var cv *tls.CertificateVerificationError
			if errors.As(err, &cv) {
				// This side refused the server's certificate (its CA, its
				// names, its dates): gRPC would refuse it the same way,
				// and asking again changes nothing until a certificate
				// or a setting does. Said at once, not retried to the
				// caller's deadline as a server that is not there.
				return nil, grpcstatus.Errorf(codes.Unauthenticated, "framerpc: %s: the server's certificate: %v", c.cfg.Addr, err)
			}
			// A server without framerpc refuses ALPN, and one that
			// refuses this side's certificate refuses gRPC too, which
			// then says so to the caller.
			return nil, errNotFramed
		}
		nc = tc
	}
	var head [len(Preface)]byte
	_, werr := io.WriteString(nc, Preface)
	var rerr error
	if werr == nil {
		_, rerr = io.ReadFull(nc, head[:])
	}
	_ = nc.SetDeadline(time.Time{})
	switch {
	case werr == nil && rerr == nil && string(head[:]) == Preface:
	case ctxDone(ctx) != nil:
		_ = nc.Close()
		return nil, grpcstatus.FromContextError(ctxDone(ctx)).Err()
	case werr == nil:
		// Something else answered, or nothing did in time, or the server
		// hung up: one that read the preface as a protocol it does not
		// know (a gRPC server answers with its HTTP/2 settings). gRPC it
		// is; a server that does speak framerpc was only slow, and gRPC
		// serves the calls as well.
		_ = nc.Close()
		return nil, errNotFramed
	default:
		_ = nc.Close()
		return nil, grpcstatus.Errorf(codes.Unavailable, "framerpc: %s: %v", c.cfg.Addr, werr)
	}
	w := &wire{c: nc, wmu: make(writeLock, 1), pending: map[uint64]chan answer{}, maxRecv: c.cfg.MaxRecvMsgSize}
	go w.read()
	return w, nil
}

// ctxDone is ctx's error, or DeadlineExceeded once its deadline has
// passed: a read that timed out at that deadline may run before ctx
// itself ends.
func ctxDone(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// dialer makes the kernel fail a connection whose path died within about
// PathTimeout (internal/pathwatch).
func (c *Conn) dialer() *net.Dialer {
	ka, control := pathwatch.Dialer(c.cfg.PathTimeout)
	return &net.Dialer{KeepAliveConfig: ka, Control: control}
}

// forget drops w, lost, so the next call dials again.
func (c *Conn) forget(w *wire) {
	c.mu.Lock()
	if c.wire == w {
		c.wire = nil
	}
	c.mu.Unlock()
}

// Close closes the connection; calls in flight fail. It does not close
// the gRPC connection. Idempotent.
func (c *Conn) Close() error {
	c.mu.Lock()
	w := c.wire
	c.wire, c.closed = nil, true
	c.mu.Unlock()
	if w != nil {
		// As gRPC's ClientConn.Close: the calls in flight are cancelled.
		w.fail(grpcstatus.Error(codes.Canceled, "grpc: the client connection is closing"))
	}
	return nil
}

// wire is one connection and its calls in flight.
type wire struct {
	c       net.Conn
	maxRecv int
	wmu     writeLock     // one frame at a time
	buf     []byte        // the frame being written, under wmu
	wdl     writeDeadline // under wmu

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan answer
	err     error // set once the connection is lost
}

type answer struct {
	kind byte
	msg  []byte
	err  error
	buf  *frameBuf // holds msg; the caller recycles it once it decoded msg
}

func (w *wire) call(ctx context.Context, method string, timeout time.Duration, md metadata.MD, msg []byte) (answer, error) {
	ch := make(chan answer, 1)
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return answer{}, err
	}
	w.next++
	id := w.next
	w.pending[id] = ch
	w.mu.Unlock()

	if err := w.wmu.lock(ctx); err != nil {
		w.drop(id)
		return answer{}, grpcstatus.FromContextError(err).Err()
	}
	b, err := appendCall(w.buf[:0], id, timeout, method, md, msg)
	if err == nil {
		w.wdl.refresh(w.c)
		if _, werr := w.c.Write(b); werr != nil {
			w.close(werr)
		}
		if cap(b) <= 64<<10 {
			w.buf = b
		}
	}
	w.wmu.Unlock()
	if err != nil {
		w.drop(id)
		return answer{}, grpcstatus.Error(codes.Internal, err.Error())
	}
	select {
	case a := <-ch:
		return a, a.err
	case <-ctx.Done():
		w.drop(id)
		return answer{}, grpcstatus.FromContextError(ctx.Err()).Err()
	}
}

// writeLock is the wire's write lock. A call waits for it only while
// its context lives: the call holding it may be blocked in a write to a
// server that stopped reading (for 15-30 s, writeDeadline, or the
// kernel's PathTimeout), and the calls behind it end at their deadlines, as
// gRPC's end while they wait for flow control.
type writeLock chan struct{}

func (l writeLock) lock(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	default:
	}
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryLock takes the lock if it is free.
func (l writeLock) TryLock() bool {
	select {
	case l <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l writeLock) Unlock() { <-l }

func (w *wire) drop(id uint64) {
	w.mu.Lock()
	delete(w.pending, id)
	w.mu.Unlock()
}

// lost reports whether the connection is gone.
func (w *wire) lost() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err != nil
}

// read delivers answers until the connection fails.
func (w *wire) read() {
	r := bufio.NewReaderSize(w.c, 64<<10)
	for {
		fb := getFrame()
		body, err := readFrame(r, fb.b, w.maxRecv+answerHead)
		fb.b = body
		var id uint64
		a := answer{buf: fb}
		var tl *TooLargeError
		switch {
		case errors.As(err, &tl):
			// As gRPC: the call fails ResourceExhausted (which callers do
			// not retry, unlike Unavailable), the connection goes on.
			id, err = skipAnswer(r, tl.Size)
			a.err = grpcstatus.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)",
				tl.Size-answerHead, w.maxRecv)
		case err == nil:
			id, a.kind, a.msg, err = parseAnswer(body)
		}
		if err != nil {
			w.close(err)
			return
		}
		w.mu.Lock()
		ch := w.pending[id]
		delete(w.pending, id)
		w.mu.Unlock()
		if ch != nil {
			ch <- a
		} else {
			putFrame(fb, body) // its call gave up waiting
		}
	}
}

// skipAnswer reads past an answer of size bytes (after its length) and
// returns its call's id.
func skipAnswer(r io.Reader, size int) (uint64, error) {
	var h [answerHead]byte
	if size < len(h) {
		return 0, malformed("answer of %d bytes", size)
	}
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, err
	}
	if _, err := io.CopyN(io.Discard, r, int64(size-len(h))); err != nil {
		return 0, err
	}
	return leUint64(h[:]), nil
}

// close fails every call in flight with codes.Unavailable, as gRPC fails
// calls on a connection lost, and closes the connection.
func (w *wire) close(cause error) {
	w.fail(grpcstatus.Errorf(codes.Unavailable, "framerpc: connection to %s lost: %v", w.c.RemoteAddr(), cause))
}

// fail fails every call in flight, and every later one, with err (the
// first one given), and closes the connection.
func (w *wire) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	pending := w.pending
	w.pending = map[uint64]chan answer{}
	err = w.err
	w.mu.Unlock()
	_ = closeConn(w.c)
	for _, ch := range pending {
		ch <- answer{err: err}
	}
}
