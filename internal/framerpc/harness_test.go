package framerpc

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The tests' own service, built as protoc-gen-go-grpc builds one: a
// single unary method taking and returning bytes, which each test gives
// its behaviour.

const (
	testService = "framerpc.test.Test"
	callMethod  = "/" + testService + "/Call"
)

type testServer interface {
	Call(context.Context, *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error)
}

// handlerFunc is a testServer.
type handlerFunc func(context.Context, *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error)

func (f handlerFunc) Call(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	return f(ctx, in)
}

func echo(_ context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	return wrapperspb.Bytes(in.Value), nil
}

func callHandler(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
	in := new(wrapperspb.BytesValue)
	if err := dec(in); err != nil {
		return nil, err
	}
	if ic == nil {
		return srv.(testServer).Call(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: callMethod}
	return ic(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return srv.(testServer).Call(ctx, req.(*wrapperspb.BytesValue))
	})
}

var testDesc = grpc.ServiceDesc{
	ServiceName: testService,
	HandlerType: (*testServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Call", Handler: callHandler}},
}

// call makes the test service's call over cc as a generated client does.
func rpc(ctx context.Context, cc grpc.ClientConnInterface, v []byte, opts ...grpc.CallOption) ([]byte, error) {
	out := new(wrapperspb.BytesValue)
	opts = append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	if err := cc.Invoke(ctx, callMethod, wrapperspb.Bytes(v), out, opts...); err != nil {
		return nil, err
	}
	return out.Value, nil
}

// paths counts the calls that reached the interceptor by the path that
// carried them: gRPC puts its transport stream in the context, the
// framed server does not.
type paths struct{ framed, grpc atomic.Int64 }

func (p *paths) interceptor(next grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if grpc.ServerTransportStreamFromContext(ctx) == nil {
			p.framed.Add(1)
		} else {
			p.grpc.Add(1)
		}
		if next == nil {
			return h(ctx, req)
		}
		return next(ctx, req, info, h)
	}
}

type serverOpts struct {
	cfg      ServerConfig // its Interceptor runs inside the one counting paths
	grpcOpts []grpc.ServerOption
	plain    bool        // a gRPC server alone, without Split
	addr     string      // listen there (a restart); "": any port
	tls      *tls.Config // serve TLS: SplitTLS, or gRPC's own with plain
}

// server is one port serving gRPC and, unless plain, frames.
type server struct {
	addr   string
	paths  *paths
	health *health.Server
	gs     *grpc.Server
	fs     *Server // nil when plain
	stop   func()
	served chan struct{} // closed when gs.Serve returns
}

func startServer(t *testing.T, impl testServer, o serverOpts) *server {
	t.Helper()
	addr := o.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := &server{addr: ln.Addr().String(), paths: &paths{}, health: health.NewServer(), served: make(chan struct{})}
	ic := s.paths.interceptor(o.cfg.Interceptor)
	gopts := append([]grpc.ServerOption{grpc.UnaryInterceptor(ic)}, o.grpcOpts...)
	switch {
	case o.tls != nil && o.plain:
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(o.tls)))
	case o.tls != nil:
		gopts = append(gopts, grpc.Creds(Handshaken(o.tls)))
	}
	s.gs = grpc.NewServer(gopts...)
	s.gs.RegisterService(&testDesc, impl)
	healthpb.RegisterHealthServer(s.gs, s.health)
	gln := ln
	if !o.plain {
		cfg := o.cfg
		cfg.Interceptor = ic
		s.fs = NewServer(cfg)
		s.fs.RegisterService(&testDesc, impl)
		healthpb.RegisterHealthServer(s.fs, s.health)
		gln = SplitTLS(ln, s.fs, o.tls)
	}
	go func() {
		defer close(s.served)
		_ = s.gs.Serve(gln)
	}()
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			if s.fs != nil {
				s.fs.Close()
			}
			s.gs.Stop()
			<-s.served
		})
	}
	t.Cleanup(s.stop)
	return s
}

func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	gc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc client of %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = gc.Close() })
	return gc
}

// newConn returns a Conn to addr over a gRPC connection of its own;
// cfg's Addr and GRPC are set here.
func newConn(t *testing.T, addr string, cfg ConnConfig) *Conn {
	t.Helper()
	cfg.Addr, cfg.GRPC = addr, dialGRPC(t, addr)
	c := NewConn(cfg)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails t unless err is a status of code want.
func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("got %v (%v), want code %v", got, err, want)
	}
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// blocker is a handler that blocks until released (or its context
// ends), telling when each call started.
type blocker struct {
	started  chan struct{}
	release  chan struct{}
	returned atomic.Int64
	once     sync.Once
}

func newBlocker() *blocker {
	return &blocker{started: make(chan struct{}, 100), release: make(chan struct{})}
}

func (b *blocker) Call(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	if string(in.Value) != "block" {
		return wrapperspb.Bytes(in.Value), nil
	}
	b.started <- struct{}{}
	defer b.returned.Add(1)
	<-b.release
	return wrapperspb.Bytes(in.Value), nil
}

func (b *blocker) unblock() { b.once.Do(func() { close(b.release) }) }

func (b *blocker) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-b.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start")
	}
}
