// Package nettest has socket helpers for tests.
package nettest

import (
	"fmt"
	"syscall"
	"testing"
)

// RefusedAddr returns a loopback TCP address ("127.0.0.1:port") that
// refuses connections for the rest of the test: a socket is bound to it
// but never listens, so a dial gets a reset, and no other socket can take
// the port meanwhile (a port freed by closing a listener can be taken by
// the next bind or outgoing connection on the machine).
func RefusedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("nettest: socket: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("nettest: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("nettest: getsockname: %v", err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
