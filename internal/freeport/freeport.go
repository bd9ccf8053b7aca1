// Package freeport picks TCP ports for servers that must be told their
// port before they start (a child process, a server restarted at the same
// address), where port 0 and the address the server reports cannot serve.
//
// The ports lie outside the kernel's ephemeral range. A port taken from a
// bind to port 0 and freed is handed out again, to the next bind to port 0
// or outgoing connection on the machine, soon enough that a test relying
// on it fails now and then; a port outside that range is only ever taken
// by someone asking for it by number.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// Pick returns n distinct ports that no socket is bound to just now, on
// any interface.
func Pick(n int) ([]int, error) {
	return pickFrom(outsideEphemeral(), n)
}

// pickFrom returns n of ports that a listener on every interface can take
// now, tried from a random one on so that tests running at once seldom
// try the same port. Each is held until all are chosen, so they differ.
func pickFrom(ports []int, n int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	out := make([]int, 0, n)
	start := rand.IntN(len(ports))
	for i := 0; i < len(ports) && len(out) < n; i++ {
		p := ports[(start+i)%len(ports)]
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			continue
		}
		held = append(held, l)
		out = append(out, p)
	}
	if len(out) < n {
		return nil, fmt.Errorf("freeport: %d of %d ports outside the ephemeral range are free, want %d", len(out), len(ports), n)
	}
	return out, nil
}

// outsideEphemeral lists the unprivileged ports from 10000 up that the
// kernel never hands out on its own: those outside
// net.ipv4.ip_local_port_range.
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
	if len(ports) == 0 { // a range covering all of them: take any
		for p := 10000; p <= 65535; p++ {
			ports = append(ports, p)
		}
	}
	return ports
}
