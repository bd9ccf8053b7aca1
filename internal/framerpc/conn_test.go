package framerpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// One port serves both protocols: a generated client gets the same
// answers over frames as over gRPC, and each call took the path it
// should.
func TestRoundTripThroughSplit(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{})
	s.health.SetServingStatus("store", healthpb.HealthCheckResponse_NOT_SERVING)
	gc := dialGRPC(t, s.addr)
	fc := newConn(t, s.addr, ConnConfig{})
	ctx := ctxTimeout(t, 10*time.Second)

	for _, service := range []string{"", "store", "nosuch"} {
		fr, ferr := healthpb.NewHealthClient(fc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		gr, gerr := healthpb.NewHealthClient(gc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if !proto.Equal(fr, gr) || status.Code(ferr) != status.Code(gerr) {
			t.Errorf("Check(%q): framed %v, %v; gRPC %v, %v", service, fr, ferr, gr, gerr)
		}
	}
	for _, v := range [][]byte{nil, []byte("x"), bytes.Repeat([]byte("0123456789"), 100_000)} {
		fv, ferr := rpc(ctx, fc, v)
		gv, gerr := rpc(ctx, gc, v)
		if ferr != nil || gerr != nil || !bytes.Equal(fv, v) || !bytes.Equal(gv, v) {
			t.Errorf("echo of %d bytes: framed %d bytes, %v; gRPC %d bytes, %v", len(v), len(fv), ferr, len(gv), gerr)
		}
	}
	if !fc.Framed() {
		t.Fatal("the Conn fell back to gRPC on a split port")
	}
	// 3 Checks and 3 echoes each way.
	if f, g := s.paths.framed.Load(), s.paths.grpc.Load(); f != 6 || g != 6 {
		t.Fatalf("calls seen framed %d, over gRPC %d; want 6 and 6", f, g)
	}

	// A call with options a frame does not carry, and a stream, go over
	// gRPC.
	if _, err := rpc(ctx, fc, []byte("opt"), grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if f, g := s.paths.framed.Load(), s.paths.grpc.Load(); f != 6 || g != 7 {
		t.Fatalf("a call with WaitForReady: framed %d, gRPC %d; want 6 and 7", f, g)
	}
	w, err := healthpb.NewHealthClient(fc).Watch(ctx, &healthpb.HealthCheckRequest{Service: "store"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch over the Conn: %v, %v", r, err)
	}
}

// A status with details arrives as gRPC would deliver it.
func TestStatusFidelity(t *testing.T) {
	detailed, err := status.New(codes.FailedPrecondition, "replica 3 of \"k\" is\nnot ready: ünïcode").
		WithDetails(wrapperspb.String("detail"), &structpb.Struct{Fields: map[string]*structpb.Value{"n": structpb.NewNumberValue(7)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"details", detailed.Err(), codes.FailedPrecondition},
		{"plain status", status.Error(codes.NotFound, "no such key"), codes.NotFound},
		{"wrapped status", fmt.Errorf("commit: %w", status.Error(codes.Aborted, "lost the race")), codes.Aborted},
		{"not a status", errors.New("boom"), codes.Unknown},
		{"context deadline", context.DeadlineExceeded, codes.DeadlineExceeded},
		{"context canceled", fmt.Errorf("lookup: %w", context.Canceled), codes.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, handlerFunc(func(context.Context, *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
				return nil, tc.err
			}), serverOpts{})
			fc := newConn(t, s.addr, ConnConfig{})
			ctx := ctxTimeout(t, 10*time.Second)
			_, ferr := rpc(ctx, fc, nil)
			_, gerr := rpc(ctx, dialGRPC(t, s.addr), nil)
			if s.paths.framed.Load() != 1 {
				t.Fatal("the call did not go framed")
			}
			fs, gs := status.Convert(ferr), status.Convert(gerr)
			if gs.Code() != tc.want {
				t.Fatalf("gRPC answered %v, the test expects %v", gs.Code(), tc.want)
			}
			if !proto.Equal(fs.Proto(), gs.Proto()) {
				t.Fatalf("framed status %v, gRPC's %v", fs.Proto(), gs.Proto())
			}
		})
	}
}

// staticCreds adds fixed metadata to every call.
type staticCreds map[string]string

func (c staticCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return c, nil
}
func (c staticCreds) RequireTransportSecurity() bool { return false }

type failingCreds struct{}

func (failingCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return nil, errors.New("no token")
}
func (failingCreds) RequireTransportSecurity() bool { return false }

// Metadata from the context and from the credentials reach the
// interceptor, which can refuse the call.
func TestMetadataAndAuth(t *testing.T) {
	var seen sync.Map // x-call value -> incoming metadata
	var ran atomic.Int64
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-call"); len(v) == 1 {
			seen.Store(v[0], md)
		}
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer tok" {
			return nil, status.Errorf(codes.Unauthenticated, "authorization %q", got)
		}
		return h(ctx, req)
	}
	s := startServer(t, handlerFunc(func(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		ran.Add(1)
		return echo(ctx, in)
	}), serverOpts{cfg: ServerConfig{Interceptor: auth}})
	bin := string([]byte{0, 1, 2, 0xff})
	ctx := metadata.AppendToOutgoingContext(ctxTimeout(t, 10*time.Second),
		"Tenant", "t1", "tenant", "t2", "trace-bin", bin)

	authed := newConn(t, s.addr, ConnConfig{Creds: []credentials.PerRPCCredentials{staticCreds{"authorization": "Bearer tok"}, staticCreds{"x-extra": "e"}}})
	if _, err := rpc(metadata.AppendToOutgoingContext(ctx, "x-call", "authed"), authed, []byte("v")); err != nil {
		t.Fatalf("authorized call: %v", err)
	}
	v, _ := seen.Load("authed")
	md, _ := v.(metadata.MD)
	for k, want := range map[string][]string{"tenant": {"t1", "t2"}, "trace-bin": {bin}, "authorization": {"Bearer tok"}, "x-extra": {"e"}} {
		if got := md.Get(k); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("incoming %s: %q, want %q (all: %v)", k, got, want, md)
		}
	}

	for _, tc := range []struct {
		name  string
		creds []credentials.PerRPCCredentials
	}{
		{"no creds", nil},
		{"wrong token", []credentials.PerRPCCredentials{staticCreds{"authorization": "Bearer other"}}},
		{"creds failing", []credentials.PerRPCCredentials{failingCreds{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConn(t, s.addr, ConnConfig{Creds: tc.creds})
			before := ran.Load()
			_, err := rpc(metadata.AppendToOutgoingContext(ctx, "x-call", tc.name), c, []byte("v"))
			wantCode(t, err, codes.Unauthenticated)
			if ran.Load() != before {
				t.Fatal("the handler ran for a refused call")
			}
			if !c.Framed() {
				t.Fatal("the Conn fell back to gRPC")
			}
		})
	}
	if n := s.paths.grpc.Load(); n != 0 {
		t.Fatalf("%d calls went over gRPC", n)
	}
}

// The handler sees the caller's deadline; one too slow for it fails the
// caller on time, and the connection serves the next call.
func TestDeadline(t *testing.T) {
	var seenDeadline atomic.Pointer[time.Time]
	s := startServer(t, handlerFunc(func(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		switch string(in.Value) {
		case "deadline":
			d, ok := ctx.Deadline()
			if !ok {
				return nil, status.Error(codes.FailedPrecondition, "no deadline")
			}
			seenDeadline.Store(&d)
		case "slow":
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return echo(ctx, in)
	}), serverOpts{})
	c := newConn(t, s.addr, ConnConfig{})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	want, _ := ctx.Deadline()
	if _, err := rpc(ctx, c, []byte("deadline")); err != nil {
		t.Fatal(err)
	}
	// The server counts the timeout from the frame's arrival: its
	// deadline is the caller's plus the transit.
	if got := *seenDeadline.Load(); got.After(want.Add(time.Second)) || got.Before(want.Add(-time.Second)) {
		t.Fatalf("the handler's deadline is %v off the caller's", got.Sub(want))
	}

	start := time.Now()
	_, err := rpc(ctxTimeout(t, 100*time.Millisecond), c, []byte("slow"))
	wantCode(t, err, codes.DeadlineExceeded)
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("a call of 100 ms failed after %v", el)
	}
	if v, err := rpc(ctxTimeout(t, 10*time.Second), c, []byte("next")); err != nil || string(v) != "next" {
		t.Fatalf("the call after a deadline: %q, %v", v, err)
	}
	if f := s.paths.framed.Load(); f != 3 || !c.Framed() {
		t.Fatalf("%d framed calls (Framed %v), want 3", f, c.Framed())
	}
}

func TestUnknownMethod(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{})
	c := newConn(t, s.addr, ConnConfig{})
	ctx := ctxTimeout(t, 10*time.Second)
	for _, m := range []string{"/" + testService + "/Nope", "/no.such.Service/Call", "nonsense"} {
		err := c.Invoke(ctx, m, wrapperspb.Bytes(nil), new(wrapperspb.BytesValue), grpc.StaticMethod())
		wantCode(t, err, codes.Unimplemented)
	}
	if _, err := rpc(ctx, c, []byte("v")); err != nil || !c.Framed() || s.paths.grpc.Load() != 0 {
		t.Fatalf("after unknown methods: %v, Framed %v, %d gRPC calls", err, c.Framed(), s.paths.grpc.Load())
	}
}

// A request over the server's limit is refused as gRPC refuses it, and
// the connection serves the next call.
func TestServerMaxRecvMsgSize(t *testing.T) {
	const limit = 1 << 10
	s := startServer(t, handlerFunc(echo), serverOpts{
		cfg:      ServerConfig{MaxRecvMsgSize: limit},
		grpcOpts: []grpc.ServerOption{grpc.MaxRecvMsgSize(limit)},
	})
	c := newConn(t, s.addr, ConnConfig{})
	gc := dialGRPC(t, s.addr)
	ctx := ctxTimeout(t, 10*time.Second)
	for _, n := range []int{limit - 16, 2 * limit, 64 << 10, 1 << 20} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			v := bytes.Repeat([]byte{'a'}, n)
			_, ferr := rpc(ctx, c, v)
			_, gerr := rpc(ctx, gc, v)
			if status.Code(ferr) != status.Code(gerr) {
				t.Fatalf("%d bytes: framed %v, gRPC %v", n, ferr, gerr)
			}
			if got, err := rpc(ctx, c, []byte("next")); err != nil || string(got) != "next" {
				t.Fatalf("the call after one of %d bytes: %q, %v", n, got, err)
			}
		})
	}
	if !c.Framed() {
		t.Fatal("the Conn fell back to gRPC")
	}
}

// A reply over the Conn's limit fails its call ResourceExhausted, as
// gRPC's; the next call goes on.
func TestConnMaxRecvMsgSize(t *testing.T) {
	s := startServer(t, handlerFunc(func(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		if string(in.Value) == "big" {
			return wrapperspb.Bytes(make([]byte, 4<<10)), nil
		}
		return echo(ctx, in)
	}), serverOpts{})
	c := newConn(t, s.addr, ConnConfig{MaxRecvMsgSize: 1 << 10})
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := rpc(ctx, c, []byte("first")); err != nil {
		t.Fatal(err)
	}
	_, err := rpc(ctx, c, []byte("big"))
	wantCode(t, err, codes.ResourceExhausted)
	if v, err := rpc(ctx, c, []byte("next")); err != nil || string(v) != "next" {
		t.Fatalf("the call after a reply too large: %q, %v", v, err)
	}
	if f := s.paths.framed.Load(); f != 3 || !c.Framed() {
		t.Fatalf("%d framed calls (Framed %v), want 3", f, c.Framed())
	}
}

// A server without framerpc is called over gRPC.
func TestFallbackToGRPC(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{plain: true})
	c := newConn(t, s.addr, ConnConfig{})
	ctx := ctxTimeout(t, 10*time.Second)
	for i := range 3 {
		v := []byte("call " + strconv.Itoa(i))
		if got, err := rpc(ctx, c, v); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("call %d: %q, %v", i, got, err)
		}
		if c.Framed() {
			t.Fatal("Framed() over a plain gRPC server")
		}
	}
	if g := s.paths.grpc.Load(); g != 3 {
		t.Fatalf("the server saw %d gRPC calls, want 3", g)
	}
}

// A server that dies under a call fails it at once, not at its
// deadline; the Conn dials the server that replaces it.
func TestServerKilledMidCall(t *testing.T) {
	b, s, c, ctx, errc := blockedCall(t)
	start := time.Now()
	stopped := make(chan struct{})
	go func() {
		s.stop()
		close(stopped)
	}()
	select {
	case err := <-errc:
		wantCode(t, err, codes.Unavailable)
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not fail within 10 s of its server's end")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the call failed %v after its server's end", el)
	}
	// Server.Close waits for the handler it cancelled.
	b.unblock()
	<-stopped
	if b.returned.Load() != 1 {
		t.Fatal("Server.Close returned before its handler")
	}

	s2 := startServer(t, handlerFunc(echo), serverOpts{addr: s.addr})
	if v, err := rpc(ctx, c, []byte("again")); err != nil || string(v) != "again" {
		t.Fatalf("the call to the new server: %q, %v", v, err)
	}
	if s2.paths.framed.Load() != 1 {
		t.Fatal("the call to the new server did not go framed")
	}
}

// A connection lost while no call was in flight is dialed again by the
// next call, which does not fail for it.
func TestServerRestartWhileIdle(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{})
	c := newConn(t, s.addr, ConnConfig{})
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := rpc(ctx, c, []byte("first")); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	w := c.wire
	c.mu.Unlock()
	s.stop()
	s2 := startServer(t, handlerFunc(echo), serverOpts{addr: s.addr})
	eventually(t, 5*time.Second, "the Conn notices its server's end", w.lost)
	if v, err := rpc(ctx, c, []byte("again")); err != nil || string(v) != "again" {
		t.Fatalf("the first call after a restart: %q, %v", v, err)
	}
	if s2.paths.framed.Load() != 1 {
		t.Fatal("the call to the new server did not go framed")
	}
}

// Many calls at once over one Conn each get their own answer.
func TestConcurrentCalls(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{})
	c := newConn(t, s.addr, ConnConfig{})
	ctx := ctxTimeout(t, 30*time.Second)
	const goroutines, calls = 32, 40
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range calls {
				v := []byte(fmt.Sprintf("g%d-i%d-%s", g, i, bytes.Repeat([]byte{'x'}, (g*calls+i)%997)))
				got, err := rpc(ctx, c, v)
				if err == nil && !bytes.Equal(got, v) {
					err = fmt.Errorf("call %q answered %q", v[:8], got[:min(8, len(got))])
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if f := s.paths.framed.Load(); f != goroutines*calls {
		t.Fatalf("%d framed calls, want %d", f, goroutines*calls)
	}
}

// MaxConcurrentCalls of 1 runs one handler at a time and fails no call.
func TestMaxConcurrentCalls(t *testing.T) {
	var active, most atomic.Int64
	s := startServer(t, handlerFunc(func(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		n := active.Add(1)
		defer active.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		// Stay a while, or until a second handler shows up: a limit
		// that does not hold is seen.
		end := time.Now().Add(20 * time.Millisecond)
		for active.Load() == 1 && time.Now().Before(end) {
			runtime.Gosched()
		}
		return echo(ctx, in)
	}), serverOpts{cfg: ServerConfig{MaxConcurrentCalls: 1}})
	c := newConn(t, s.addr, ConnConfig{})
	ctx := ctxTimeout(t, 30*time.Second)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			v := []byte(strconv.Itoa(i))
			if got, err := rpc(ctx, c, v); err != nil || !bytes.Equal(got, v) {
				t.Errorf("call %d: %q, %v", i, got, err)
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m != 1 {
		t.Fatalf("%d handlers ran at once, want 1", m)
	}
}

// Conn.Close fails the calls in flight and later ones as gRPC's Close
// does; a second Close is harmless.
func TestConnClose(t *testing.T) {
	_, s, c, ctx, errc := blockedCall(t)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		wantCode(t, err, codes.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not fail the call in flight")
	}
	_, err := rpc(ctx, c, []byte("later"))
	wantCode(t, err, codes.Canceled)
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if s.paths.framed.Load() != 1 {
		t.Fatal("a call after Close reached the server")
	}
}

// Server.Close may be called again, and a connection served after it is
// closed at once.
func TestServerCloseIdempotent(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{})
	c := newConn(t, s.addr, ConnConfig{})
	if _, err := rpc(ctxTimeout(t, 10*time.Second), c, []byte("v")); err != nil {
		t.Fatal(err)
	}
	s.fs.Close()
	s.fs.Close()
	p1, p2 := net.Pipe()
	defer p2.Close()
	done := make(chan struct{})
	go func() {
		s.fs.ServeConn(p1)
		close(done)
	}()
	_ = p2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := p2.Read(make([]byte, len(Preface))); err == nil || n != 0 {
		t.Fatalf("a closed server answered %d bytes, %v", n, err)
	}
	<-done
}

// Closing everything leaves no goroutine behind.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		fs := NewServer(ServerConfig{})
		fs.RegisterService(&testDesc, handlerFunc(echo))
		sl := Split(ln, fs)
		c := NewConn(ConnConfig{Addr: ln.Addr().String(), GRPC: unusedGRPC{}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				if _, err := rpc(ctx, c, []byte(strconv.Itoa(i))); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		_ = c.Close()
		fs.Close()
		_ = sl.Close()
	}()
	eventually(t, 5*time.Second, "goroutines back to "+strconv.Itoa(before), func() bool {
		return runtime.NumGoroutine() <= before
	})
}

// unusedGRPC is a gRPC connection that no call should reach.
type unusedGRPC struct{}

func (unusedGRPC) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return status.Error(codes.Internal, "a call went to gRPC")
}

func (unusedGRPC) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Internal, "a stream went to gRPC")
}

// A first call whose deadline ends while the server has not yet
// answered the preface fails with its deadline; the Conn stays framed.
func TestDialDeadlineKeepsFramed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, nc := range conns {
			_ = nc.Close()
		}
		mu.Unlock()
		held.Wait()
	})
	held.Go(func() { // accepts and never answers
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
		}
	})
	for i := range 20 {
		c := NewConn(ConnConfig{Addr: ln.Addr().String(), GRPC: unusedGRPC{}, DialTimeout: 10 * time.Second})
		_, err := rpc(ctxTimeout(t, 20*time.Millisecond), c, []byte("v"))
		_ = c.Close()
		if status.Code(err) != codes.DeadlineExceeded || !c.Framed() {
			t.Fatalf("try %d: %v, Framed %v; want DeadlineExceeded, still framed", i, err, c.Framed())
		}
	}
}

// Limits as large as an int goes (gRPC takes math.MaxInt for "no
// limit") bound nothing, and overflow nothing.
func TestHugeLimits(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{cfg: ServerConfig{MaxRecvMsgSize: math.MaxInt}})
	c := newConn(t, s.addr, ConnConfig{MaxRecvMsgSize: math.MaxInt, MaxSendMsgSize: math.MaxInt})
	if v, err := rpc(ctxTimeout(t, 10*time.Second), c, []byte("v")); err != nil || string(v) != "v" {
		t.Fatalf("a call under limits of math.MaxInt: %q, %v", v, err)
	}
	if s.paths.framed.Load() != 1 {
		t.Fatal("the call did not go framed")
	}
}

// A Conn that fell back to gRPC tries frames again once Reprobe has
// passed: a server upgraded in place (here: a plain gRPC server replaced
// by one that also speaks frames, on the same port) gets frames again.
func TestFallbackReprobes(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{plain: true})
	c := newConn(t, s.addr, ConnConfig{Reprobe: 200 * time.Millisecond})
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := rpc(ctx, c, []byte("old")); err != nil {
		t.Fatal(err)
	}
	if c.Framed() {
		t.Fatal("Framed() over a plain gRPC server")
	}
	s.stop()
	s2 := startServer(t, handlerFunc(echo), serverOpts{addr: s.addr})
	// Within Reprobe the Conn keeps to gRPC, which reconnects by itself.
	eventually(t, 5*time.Second, "a call through the gRPC connection", func() bool {
		_, err := rpc(ctx, c, []byte("grpc"))
		return err == nil
	})
	eventually(t, 5*time.Second, "frames again after Reprobe", func() bool {
		v, err := rpc(ctx, c, []byte("new"))
		return err == nil && string(v) == "new" && s2.paths.framed.Load() > 0
	})
	if !c.Framed() {
		t.Fatal("Framed() false after a framed call")
	}
}

// A call whose connection is lost has its context ended, as gRPC's end
// with their transport, rather than running on to its deadline.
func TestLostConnectionEndsItsCalls(t *testing.T) {
	started, ended := make(chan struct{}), make(chan error, 1)
	s := startServer(t, handlerFunc(func(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}), serverOpts{})
	c := newConn(t, s.addr, ConnConfig{})
	go func() { _, _ = rpc(ctxTimeout(t, time.Minute), c, []byte("wait")) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start")
	}
	_ = c.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the handler's context ended with %v, want Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context outlived its connection")
	}
}

// blockedCall starts a server whose handler blocks on "block" (released
// at the test's end), a Conn to it, and a call of "block" on a goroutine;
// it returns once the handler runs, with the call's context and where its
// error will come.
func blockedCall(t *testing.T) (*blocker, *server, *Conn, context.Context, chan error) {
	t.Helper()
	b := newBlocker()
	s := startServer(t, b, serverOpts{})
	t.Cleanup(b.unblock)
	c := newConn(t, s.addr, ConnConfig{})
	ctx := ctxTimeout(t, 30*time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := rpc(ctx, c, []byte("block"))
		errc <- err
	}()
	b.waitStarted(t)
	return b, s, c, ctx, errc
}
