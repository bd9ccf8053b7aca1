package nettest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
)

// FreePort returns a TCP port that no socket is bound to just now, on any
// interface, for a server that must be told its port before it starts. The
// port lies outside the kernel's ephemeral range, so no bind to port 0 and
// no outgoing connection on the machine is given it before the server
// binds it; a port taken from a bind to port 0 and freed is handed out
// again soon enough that a test relying on it fails now and then.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freeIn(outsideEphemeral())
	if err != nil {
		t.Fatalf("nettest: %v", err)
	}
	return p
}

// freeIn returns one of ports that a listener on every interface can take
// now, trying them from a random one on so that tests running at once
// seldom try the same port.
func freeIn(ports []int) (int, error) {
	start := rand.IntN(len(ports))
	for i := range ports {
		p := ports[(start+i)%len(ports)]
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			continue
		}
		return p, l.Close()
	}
	return 0, fmt.Errorf("none of %d ports outside the ephemeral range is free", len(ports))
}

// outsideEphemeral lists the unprivileged ports the kernel never hands out
// on its own: those below and above net.ipv4.ip_local_port_range.
func outsideEphemeral() []int {
	low, high := 32768, 60999 // Linux's defaults
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var l, h int
		if n, _ := fmt.Sscan(string(b), &l, &h); n == 2 && l <= h {
			low, high = l, h
		}
	}
	var ports []int
	for p := 10000; p <= 65535; p++ {
		if p < low || p > high {
			ports = append(ports, p)
		}
	}
	if len(ports) == 0 { // a range covering everything: take any port
		for p := 10000; p <= 65535; p++ {
			ports = append(ports, p)
		}
	}
	return ports
}
