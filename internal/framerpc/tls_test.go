package framerpc

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/mooncake-go/mooncake/internal/secure"
)

// tlsPair is a server's mutual TLS configuration and a client's, with its
// certificate and without, from a CA of their own.
func tlsPair(t *testing.T) (server, client, noCert *tls.Config) {
	t.Helper()
	files, err := secure.Generate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var errs [3]error
	server, errs[0] = files.ServerTLS().Server()
	client, errs[1] = files.ClientTLS().Client()
	noCert, errs[2] = secure.TLS{CAFile: files.CA}.Client()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return server, client, noCert
}

// dialGRPCTLS is dialGRPC over TLS with cfg.
func dialGRPCTLS(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	gc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gc.Close() })
	return gc
}

// newConnTLS is newConn over TLS with cfg, its gRPC connection too.
func newConnTLS(t *testing.T, addr string, cfg *tls.Config) *Conn {
	t.Helper()
	c := NewConn(ConnConfig{Addr: addr, GRPC: dialGRPCTLS(t, addr, cfg), TLS: cfg})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Over SplitTLS frames and gRPC share a TLS port: a Conn's calls go as
// frames inside TLS, a gRPC client's through the same handshake, its peer
// seen with its TLS state (the framed server sets no peer); a client
// without the certificate the server requires, or without TLS, gets
// nothing from either.
func TestSplitTLS(t *testing.T) {
	srv, cli, noCert := tlsPair(t)
	var mu sync.Mutex
	var auth []credentials.AuthInfo
	s := startServer(t, handlerFunc(func(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		if p, ok := peer.FromContext(ctx); ok {
			mu.Lock()
			auth = append(auth, p.AuthInfo)
			mu.Unlock()
		}
		return in, nil
	}), serverOpts{tls: srv})
	ctx := ctxTimeout(t, 10*time.Second)

	c := newConnTLS(t, s.addr, cli)
	if v, err := rpc(ctx, c, []byte("f")); err != nil || string(v) != "f" || !c.Framed() {
		t.Fatalf("a framed call over TLS: %q, %v (Framed %v)", v, err, c.Framed())
	}
	if v, err := rpc(ctx, dialGRPCTLS(t, s.addr, cli), []byte("g")); err != nil || string(v) != "g" {
		t.Fatalf("a gRPC call over TLS: %q, %v", v, err)
	}
	if s.paths.framed.Load() != 1 || s.paths.grpc.Load() != 1 {
		t.Fatalf("framed %d, gRPC %d calls; want one each", s.paths.framed.Load(), s.paths.grpc.Load())
	}
	mu.Lock()
	if len(auth) == 0 {
		t.Error("the gRPC call's handler saw no peer")
	}
	for i, a := range auth {
		if ti, ok := a.(credentials.TLSInfo); !ok || len(ti.State.PeerCertificates) == 0 {
			t.Errorf("call %d: peer %T %v, want TLS with the client's certificate", i, a, a)
		}
	}
	mu.Unlock()

	_, err := rpc(ctxTimeout(t, 3*time.Second), newConnTLS(t, s.addr, noCert), []byte("x"))
	wantCode(t, err, codes.Unavailable)
	_, err = rpc(ctxTimeout(t, 3*time.Second), newConn(t, s.addr, ConnConfig{}), []byte("x"))
	if err == nil {
		t.Fatal("a plaintext call was answered by a TLS server")
	}
	if n := s.paths.framed.Load() + s.paths.grpc.Load(); n != 2 {
		t.Fatalf("%d calls reached the server, want the 2 with certificates", n)
	}
}

// A Conn over TLS to a gRPC server without framerpc (ALPN "h2" only)
// turns to gRPC, and its calls are answered.
func TestTLSConnFallsBackToGRPC(t *testing.T) {
	srv, cli, _ := tlsPair(t)
	s := startServer(t, handlerFunc(echo), serverOpts{tls: srv, plain: true})
	c := newConnTLS(t, s.addr, cli)
	ctx := ctxTimeout(t, 10*time.Second)
	if v, err := rpc(ctx, c, []byte("v")); err != nil || string(v) != "v" {
		t.Fatalf("%q, %v", v, err)
	}
	if c.Framed() || s.paths.grpc.Load() != 1 {
		t.Fatalf("Framed %v, gRPC calls %d: want gRPC", c.Framed(), s.paths.grpc.Load())
	}
}

// A Conn that cannot verify the server's certificate (another CA's) says
// so at once, as Unauthenticated with the cause, and does not turn to gRPC,
// which would refuse it the same way as a server not there (Unavailable,
// which callers retry to their deadline).
func TestTLSServerCertificateRefused(t *testing.T) {
	srv, _, _ := tlsPair(t)
	_, other, _ := tlsPair(t) // a client of another CA
	s := startServer(t, handlerFunc(echo), serverOpts{tls: srv})
	c := newConnTLS(t, s.addr, other)
	_, err := rpc(ctxTimeout(t, 10*time.Second), c, []byte("x"))
	wantCode(t, err, codes.Unauthenticated)
	if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("%v: the cause is not named", err)
	}
	if !c.Framed() {
		t.Error("the Conn turned to gRPC")
	}
	if n := s.paths.framed.Load() + s.paths.grpc.Load(); n != 0 {
		t.Errorf("%d calls reached the server", n)
	}
}

// Connections that never finish their handshake hold up no other.
func TestSplitTLSSlowHandshakes(t *testing.T) {
	srv, cli, _ := tlsPair(t)
	s := startServer(t, handlerFunc(echo), serverOpts{tls: srv})
	for _, send := range []string{"", "\x16\x03\x01\x00", Preface} {
		nc, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		if _, err := io.WriteString(nc, send); err != nil {
			t.Fatal(err)
		}
	}
	ctx := ctxTimeout(t, 3*time.Second) // well under the 10 s a handshake may take
	c := newConnTLS(t, s.addr, cli)
	if v, err := rpc(ctx, c, []byte("v")); err != nil || string(v) != "v" || !c.Framed() {
		t.Fatalf("a framed call beside stalled handshakes: %q, %v (Framed %v)", v, err, c.Framed())
	}
	if v, err := rpc(ctx, dialGRPCTLS(t, s.addr, cli), []byte("w")); err != nil || string(v) != "w" {
		t.Fatalf("a gRPC call beside stalled handshakes: %q, %v", v, err)
	}
}
