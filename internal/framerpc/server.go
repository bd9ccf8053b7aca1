package framerpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Interceptor runs around every call, as the gRPC server's chained
	// unary interceptors do (ChainUnary makes one of several). Nil: none.
	Interceptor grpc.UnaryServerInterceptor
	// MaxRecvMsgSize bounds a call's request message; a larger one is
	// answered codes.ResourceExhausted, as gRPC does. Zero: 4 MiB, gRPC's
	// default.
	MaxRecvMsgSize int
	// MaxConcurrentCalls bounds the calls one connection runs at once;
	// the connection's next call is read when one ends. Zero: 1024.
	MaxConcurrentCalls int
	// Log receives connection errors. Nil: slog.Default().
	Log *slog.Logger
}

// Server runs the unary methods of registered gRPC services for framed
// connections.
type Server struct {
	cfg     ServerConfig
	methods map[string]method

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

type method struct {
	impl    any
	handler grpc.MethodHandler
}

var _ grpc.ServiceRegistrar = (*Server)(nil)

// NewServer returns a Server with no services.
func NewServer(cfg ServerConfig) *Server {
	if cfg.MaxRecvMsgSize <= 0 {
		cfg.MaxRecvMsgSize = 4 << 20
	}
	// A frame's length is a u32: a larger limit is none, and must not
	// overflow the frame's limit, which adds the header to it.
	cfg.MaxRecvMsgSize = min(cfg.MaxRecvMsgSize, math.MaxUint32)
	if cfg.MaxConcurrentCalls <= 0 {
		cfg.MaxConcurrentCalls = 1024
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, methods: map[string]method{}, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
}

// RegisterService registers the unary methods of desc, served by impl;
// its streams are gRPC's alone. Call it before serving.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = method{impl: impl, handler: m.Handler}
	}
}

// ServeConn serves c, whose Preface has been read, until it fails or the
// Server closes; it closes c.
func (s *Server) ServeConn(c net.Conn) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = closeConn(c)
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	// The calls of a connection end with it, as gRPC's end with their
	// transport: nobody is left to hear their answers.
	ctx, cancel := context.WithCancel(s.ctx)
	sc := &serverConn{s: s, c: c, ctx: ctx, slots: make(chan struct{}, s.cfg.MaxConcurrentCalls), work: make(chan job)}
	err := sc.serve()
	_ = closeConn(c)
	cancel()
	sc.calls.Wait()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) { // serve ends only on an error
		s.cfg.Log.Info("framerpc: connection closed", "peer", c.RemoteAddr().String(), "err", err)
	}
}

// Close closes every connection, cancels the calls running and waits for
// them. Idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		_ = closeConn(c)
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// serverConn is one connection's calls.
type serverConn struct {
	s     *Server
	c     net.Conn
	ctx   context.Context // ends with the connection
	slots chan struct{}   // one per call running
	calls sync.WaitGroup  // the workers
	wmu   sync.Mutex      // one answer at a time
	wdl   writeDeadline   // under wmu
	// Calls run on workers kept between calls (up to idleWorkers waiting
	// for one): a goroutine started for each call would grow its stack
	// through the handler's depth (the interceptors, the context's
	// deadline, protobuf's decoder) on every call.
	work chan job
	idle atomic.Int32
}

// job is a call read and the frame that holds it.
type job struct {
	c    call
	fb   *frameBuf
	body []byte
}

// idleWorkers is how many workers a connection keeps waiting for calls:
// a client's calls mostly come one or two at a time, and the collector
// shrinks the stacks of those that wait long.
const idleWorkers = 4

func (sc *serverConn) serve() error {
	if _, err := io.WriteString(sc.c, Preface); err != nil {
		return err
	}
	r := bufio.NewReaderSize(sc.c, 64<<10)
	// A call's header and metadata ride with its message.
	limit := sc.s.cfg.MaxRecvMsgSize + callHead + 4 + math.MaxUint16 + maxMetadataBytes + 4*maxMetadata
	for {
		fb := getFrame()
		body, err := readFrame(r, fb.b, limit)
		var tl *TooLargeError
		if errors.As(err, &tl) {
			putFrame(fb, body)
			// Answered as gRPC does, then skipped: the connection goes on.
			if err := sc.refuseLarge(r, tl); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		c, err := parseCall(body)
		if err != nil {
			return err // the stream cannot be trusted past a bad frame
		}
		sc.slots <- struct{}{}
		j := job{c, fb, body}
		select {
		case sc.work <- j: // a worker was waiting
		default:
			sc.calls.Add(1)
			go sc.worker(j)
		}
	}
}

// worker runs j, then the calls handed to it while it waits, until more
// than idleWorkers wait or the connection ends.
func (sc *serverConn) worker(j job) {
	defer sc.calls.Done()
	for {
		sc.run(j.c)
		// c.msg, in body, was decoded (copied) or refused by now.
		putFrame(j.fb, j.body)
		<-sc.slots
		j = job{} // its frame went back to the pool
		if sc.idle.Add(1) > idleWorkers {
			sc.idle.Add(-1)
			return
		}
		select {
		case j = <-sc.work:
			sc.idle.Add(-1)
		case <-sc.ctx.Done():
			sc.idle.Add(-1)
			return
		}
	}
}

// refuseLarge answers the call whose frame is over the limit and reads
// past it.
func (sc *serverConn) refuseLarge(r io.Reader, tl *TooLargeError) error {
	var id [8]byte
	if tl.Size < len(id) {
		return malformed("frame of %d bytes", tl.Size)
	}
	if _, err := io.ReadFull(r, id[:]); err != nil {
		return err
	}
	if _, err := io.CopyN(io.Discard, r, int64(tl.Size-len(id))); err != nil {
		return err
	}
	msg := fmt.Sprintf("framerpc: received message larger than max (%d vs. %d)", tl.Size, sc.s.cfg.MaxRecvMsgSize)
	return sc.answerErr(leUint64(id[:]), status.New(codes.ResourceExhausted, msg))
}

// run runs call c and answers it.
func (sc *serverConn) run(c call) {
	m, ok := sc.s.methods[c.method]
	if !ok {
		_ = sc.answerErr(c.id, status.Newf(codes.Unimplemented, "unknown method %s", c.method))
		return
	}
	// The frame's limit leaves room for the largest header; the message
	// itself is bounded here.
	if len(c.msg) > sc.s.cfg.MaxRecvMsgSize {
		_ = sc.answerErr(c.id, status.Newf(codes.ResourceExhausted,
			"framerpc: received message larger than max (%d vs. %d)", len(c.msg), sc.s.cfg.MaxRecvMsgSize))
		return
	}
	ctx := sc.ctx
	if c.md != nil {
		ctx = metadata.NewIncomingContext(ctx, c.md)
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	dec := func(v any) error {
		msg, ok := v.(proto.Message)
		if !ok {
			return status.Errorf(codes.Internal, "framerpc: %T is not a protobuf message", v)
		}
		if err := proto.Unmarshal(c.msg, msg); err != nil {
			return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		return nil
	}
	reply, err := m.handler(m.impl, ctx, dec, sc.s.cfg.Interceptor)
	if err != nil {
		// As gRPC's server: a context's error keeps its code.
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err)
		}
		_ = sc.answerErr(c.id, st)
		return
	}
	msg, ok := reply.(proto.Message)
	if !ok {
		_ = sc.answerErr(c.id, status.Newf(codes.Internal, "framerpc: reply %T is not a protobuf message", reply))
		return
	}
	fb := getFrame()
	b := appendAnswer(slices.Grow(fb.b, lenSize+answerHead+proto.Size(msg)), c.id, answerOK, 0)
	b, err = proto.MarshalOptions{}.MarshalAppend(b, msg)
	if err != nil {
		_ = sc.answerErr(c.id, status.Newf(codes.Internal, "grpc: error while marshaling: %v", err))
		return
	}
	sc.write(setLen(b))
	putFrame(fb, b)
}

// answerErr answers call id with st.
func (sc *serverConn) answerErr(id uint64, st *status.Status) error {
	sp, err := proto.Marshal(st.Proto())
	if err != nil {
		return err
	}
	b := appendAnswer(nil, id, answerStatus, len(sp))
	return sc.write(append(b, sp...))
}

// write sends one whole frame; an answer that cannot go out closes the
// connection (its caller sees it lost).
func (sc *serverConn) write(b []byte) error {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	sc.wdl.refresh(sc.c)
	_, err := sc.c.Write(b)
	if err != nil {
		_ = closeConn(sc.c)
	}
	return err
}

// writeTimeout bounds the write of one frame to a peer that stopped
// reading: the write fails after writeTimeout/2 to writeTimeout
// (writeDeadline).
const writeTimeout = 30 * time.Second

// writeDeadline is a connection's write deadline, kept between half of
// writeTimeout and writeTimeout ahead of every write: it is set again
// only when less than half is left, not before every frame.
type writeDeadline struct{ at time.Time }

func (d *writeDeadline) refresh(c net.Conn) {
	if now := time.Now(); d.at.Sub(now) < writeTimeout/2 {
		d.at = now.Add(writeTimeout)
		_ = c.SetWriteDeadline(d.at)
	}
}

// setLen sets the length of the frame b to what follows it.
func setLen(b []byte) []byte {
	n := len(b) - lenSize
	b[0], b[1], b[2], b[3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
	return b
}

func leUint64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// ChainUnary makes one interceptor of several, the first outermost, as
// grpc.ChainUnaryInterceptor does.
func ChainUnary(ics ...grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	switch len(ics) {
	case 0:
		return nil
	case 1:
		return ics[0]
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return ics[0](ctx, req, info, func(ctx context.Context, req any) (any, error) {
			return ChainUnary(ics[1:]...)(ctx, req, info, h)
		})
	}
}
