// Package pathwatch makes the kernel fail a TCP connection whose path
// died, rather than leave its reads and writes waiting for minutes: a
// partition, not a dead peer process, which the peer's kernel reports at
// once.
package pathwatch

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Dialer returns the keepalive settings and the socket option for a
// net.Dialer that fail a connection within about t of its path dying:
// TCP_USER_TIMEOUT bounds how long sent data may go unacknowledged, and
// keepalives (answered by a live peer's kernel, however busy its process)
// make a connection that only waits for answers send something to be
// acknowledged. Reads and writes on it then fail with ETIMEDOUT.
func Dialer(t time.Duration) (net.KeepAliveConfig, func(network, address string, rc syscall.RawConn) error) {
	probe := max(time.Second, t/2) // keepalive times are whole seconds
	ka := net.KeepAliveConfig{Enable: true, Idle: probe, Interval: probe, Count: max(2, int(t/probe)+1)}
	control := func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(t/time.Millisecond))
		}); err != nil {
			return err
		}
		return serr
	}
	return ka, control
}
