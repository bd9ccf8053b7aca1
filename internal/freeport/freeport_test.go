package freeport

import (
	"fmt"
	"net"
	"slices"
	"testing"
)

// The ports are distinct, free on every interface and outside the range
// the kernel hands out for port 0 and outgoing connections; a port a
// listener holds is never given.
func TestPick(t *testing.T) {
	ports, err := Pick(3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 3 || ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
		t.Fatalf("Pick(3) = %v, want 3 distinct ports", ports)
	}
	for _, p := range ports {
		if !slices.Contains(outsideEphemeral(), p) {
			t.Fatalf("port %d is in the ephemeral range", p)
		}
	}
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", ports[0]))
	if err != nil {
		t.Fatalf("listen on the free port %d: %v", ports[0], err)
	}
	defer ln.Close()
	for range 50 {
		if got, err := pickFrom(ports, 2); err != nil || slices.Contains(got, ports[0]) {
			t.Fatalf("pickFrom(%v, 2) with %d held = %v, %v", ports, ports[0], got, err)
		}
	}
	if got, err := pickFrom(ports, 3); err == nil {
		t.Fatalf("pickFrom(%v, 3) with %d held = %v, want an error", ports, ports[0], got)
	}
}
