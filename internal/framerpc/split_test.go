package framerpc

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Split hands a connection to gRPC with every byte it read, and serves
// those that open with the preface itself.
func TestSplitSorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := NewServer(ServerConfig{})
	defer fs.Close()
	sl := Split(ln, fs)
	defer sl.Close()

	for _, tc := range []struct {
		name   string
		send   string
		framed bool
	}{
		{"http2", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", false},
		{"preface but the last byte", Preface[:len(Preface)-1] + "X tail", false},
		{"short, then more", "MC", false},
		{"preface", Preface, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(nc, tc.send); err != nil {
				t.Fatal(err)
			}
			if tc.framed {
				echo := make([]byte, len(Preface))
				if _, err := io.ReadFull(nc, echo); err != nil || string(echo) != Preface {
					t.Fatalf("the preface echoed as %q, %v", echo, err)
				}
				return
			}
			if len(tc.send) < len(Preface) {
				// Sorting waits for a whole preface's length.
				if _, err := io.WriteString(nc, " and the rest"); err != nil {
					t.Fatal(err)
				}
				tc.send += " and the rest"
			}
			gc, err := sl.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer gc.Close()
			_ = gc.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, len(tc.send))
			// Small reads: the bytes replayed come out across them.
			for i := 0; i < len(got); {
				n, err := gc.Read(got[i:min(i+3, len(got))])
				if err != nil {
					t.Fatalf("after %q: %v", got[:i], err)
				}
				i += n
			}
			if string(got) != tc.send {
				t.Fatalf("gRPC got %q, the client sent %q", got, tc.send)
			}
		})
	}
	if err := sl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sl.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// Connections that send nothing, or part of a preface, hold up neither
// gRPC's connections nor framed ones; one that hangs up early is let go.
func TestSplitSlowConnections(t *testing.T) {
	s := startServer(t, handlerFunc(echo), serverOpts{})
	var mu sync.Mutex
	var raw []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, nc := range raw {
			_ = nc.Close()
		}
	})
	open := func(send string) net.Conn {
		nc, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		raw = append(raw, nc)
		mu.Unlock()
		if _, err := io.WriteString(nc, send); err != nil {
			t.Fatal(err)
		}
		return nc
	}
	open("")                 // silent
	open(Preface[:3])        // part of the preface
	open("PRI * ")           // part of HTTP/2's
	_ = open("MCFR").Close() // part of the preface, then gone

	// Well under the 10 s a silent connection may sit unsorted.
	ctx := ctxTimeout(t, 3*time.Second)
	r, err := healthpb.NewHealthClient(dialGRPC(t, s.addr)).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC beside slow connections: %v, %v", r, err)
	}
	c := newConn(t, s.addr, ConnConfig{})
	if v, err := rpc(ctx, c, []byte("v")); err != nil || string(v) != "v" || !c.Framed() {
		t.Fatalf("a framed call beside slow connections: %q, %v (Framed %v)", v, err, c.Framed())
	}
	if s.paths.framed.Load() != 1 {
		t.Fatal("the framed call was not served framed")
	}
	// The connection that hung up early went to gRPC, which dropped it:
	// a later gRPC client still gets in.
	_, err = rpc(ctx, dialGRPC(t, s.addr), []byte("w"))
	wantCode(t, err, codes.OK)
}

// The bytes read while sorting come first, then the connection's.
func TestPrefixConn(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	pc := &prefixConn{Conn: a, prefix: []byte("head")}
	go func() { _, _ = b.Write([]byte("body")) }()
	got, err := io.ReadAll(io.LimitReader(pc, 8))
	if err != nil || !bytes.Equal(got, []byte("headbody")) {
		t.Fatalf("read %q, %v", got, err)
	}
}
