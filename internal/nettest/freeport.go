package nettest

import (
	"testing"

	"github.com/mooncake-go/mooncake/internal/freeport"
)

// FreePort returns a TCP port that no socket is bound to just now, on any
// interface, for a server that must be told its port before it starts. It
// lies outside the kernel's ephemeral range (package freeport says why).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.Pick(1)
	if err != nil {
		t.Fatalf("nettest: %v", err)
	}
	return p[0]
}
