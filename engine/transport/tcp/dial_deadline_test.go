package tcp

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine/transport"
)

// stalledListener listens on ip with an accept queue of one connection,
// already taken by a connection nobody accepts: the kernel drops the SYNs
// of later dials, which hang (a peer's port under a burst of connects).
// open starts accepting, relaying every connection to target.
func stalledListener(t *testing.T, ip string) (addr string, open func(target string)) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	sa := &unix.SockaddrInet4{}
	copy(sa.Addr[:], net.ParseIP(ip).To4())
	require.NoError(t, unix.Bind(fd, sa))
	require.NoError(t, unix.Listen(fd, 0))
	got, err := unix.Getsockname(fd)
	require.NoError(t, err)
	addr = net.JoinHostPort(ip, strconv.Itoa(got.(*unix.SockaddrInet4).Port))
	filler, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { filler.Close() })
	// The queue is full: a dial now hangs.
	_, err = net.DialTimeout("tcp", addr, 200*time.Millisecond)
	require.Error(t, err, "a dial to a full accept queue should hang")
	f := os.NewFile(uintptr(fd), "stalled")
	opened := false
	t.Cleanup(func() {
		if !opened {
			f.Close()
		}
	})
	return addr, func(target string) {
		ln, err := net.FileListener(f)
		require.NoError(t, err)
		f.Close()
		opened = true
		r := &relay{ln: ln}
		r.wg.Add(1)
		go r.accept(target)
		t.Cleanup(r.close)
	}
}

// TestShortDeadlineDialDoesNotDownPaths: a dial cut short by its slice's
// own deadline (well under PathTimeout) says nothing about the path; it
// must not mark the path down. When it does, two such slices (one per
// path) make every path of a healthy peer count as down, and the next
// slices fail at once with "every path down" for 2*PathTimeout.
func TestShortDeadlineDialDoesNotDownPaths(t *testing.T) {
	remote := make([]byte, 1<<16)
	for i := range remote {
		remote[i] = byte(i * 13)
	}
	s := startServer(t, &testMem{base: remote})
	a, openA := stalledListener(t, "127.0.0.1")
	b, openB := stalledListener(t, "127.0.0.2")
	c := NewClient(ClientConfig{Lanes: 2, PathTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	p, err := c.Peer([]string{a, b})
	require.NoError(t, err)
	require.True(t, p.multipath)
	pr := &pair{c: c, p: p, local: make([]byte, 1<<16), remote: remote}

	// Two slices with 300 ms left: each lane dials its home path, the
	// dial gives up at the slice deadline.
	var dones []chan error
	for i := range 2 {
		sl, done := pr.slice(transport.Read, i*4096, 4096)
		sl.Deadline = time.Now().Add(300 * time.Millisecond)
		p.Submit(context.Background(), sl)
		dones = append(dones, done)
	}
	for _, done := range dones {
		require.ErrorIs(t, <-done, transport.ErrTimeout)
	}

	// Both addresses now accept at once: the peer is healthy.
	openA(s.Addr().String())
	openB(s.Addr().String())
	for _, addr := range []string{a, b} {
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err, "dial %s", addr)
		nc.Close()
	}

	sl, done := pr.slice(transport.Read, 0, 4096)
	start := time.Now()
	p.Submit(context.Background(), sl)
	err = <-done
	require.NoError(t, err, "a slice with 10 s left, to a peer whose paths both accept, failed after %v",
		time.Since(start))
}
