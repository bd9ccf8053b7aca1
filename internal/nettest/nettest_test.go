package nettest

import (
	"errors"
	"net"
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
