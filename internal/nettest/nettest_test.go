package nettest

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"
)

// The address refuses connections at once, and nothing else can listen
// on it while the test holds it.
func TestRefusedAddr(t *testing.T) {
	addr := RefusedAddr(t)
	start := time.Now()
	_, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s = %v, want connection refused", addr, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("refusal took %v", d)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("listen on %s succeeded while it is held", addr)
	}
}

// The port is free on every interface and outside the range the kernel
// hands out for port 0 and outgoing connections; a port a listener holds is
// never given.
func TestFreePort(t *testing.T) {
	p := FreePort(t)
	if !slices.Contains(outsideEphemeral(), p) {
		t.Fatalf("port %d is in the ephemeral range", p)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
	if err != nil {
		t.Fatalf("listen on the free port %d: %v", p, err)
	}
	defer ln.Close()
	q := FreePort(t)
	for range 50 {
		if got, err := freeIn([]int{p, q}); err != nil || got != q {
			t.Fatalf("freeIn(%d held, %d free) = %d, %v; want %d", p, q, got, err, q)
		}
	}
	if got, err := freeIn([]int{p}); err == nil {
		t.Fatalf("freeIn(%d held) = %d, want an error", p, got)
	}
}
