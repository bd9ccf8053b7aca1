package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/logtest"
)

// dialFrom connects to addr from the loopback address ip (all of
// 127.0.0.0/8 is local on Linux), so that one test plays several peers.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil && ip != "127.0.0.1" {
		t.Skipf("cannot dial from %s: %v", ip, err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// readOnce reads 8 bytes at addr over a raw v2 connection: the server
// answers it only if it serves the connection. An error says it hung up.
func readOnce(c net.Conn, addr uint64, want []byte) error {
	var hdr [HeaderSize]byte
	PutHeader(hdr[:], Header{Size: uint64(len(want)), Addr: addr, Op: opRead, V2: true})
	// A refused connection is closed without a word: the deadline only
	// stops a test of a server that would serve it.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(hdr[:]); err != nil {
		return err
	}
	got := make([]byte, StatusSize+len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got[:StatusSize], status(StatusOK)) || !bytes.Equal(got[StatusSize:], want) {
		return errors.New("wrong answer")
	}
	return nil
}

// TestServerConnectionLimits has one peer open connections past the
// per-peer limit: the extras are closed unserved, with a logged reason,
// those within it are served, and a client from another address still
// transfers. Past the total limit, every peer is refused.
func TestServerConnectionLimits(t *testing.T) {
	remote := make([]byte, 1<<16)
	for i := range remote {
		remote[i] = byte(i * 7)
	}
	base := uint64(uintptr(unsafe.Pointer(&remote[0])))
	var logs logtest.Buffer // the server's goroutines write it while the test reads
	s, err := Listen("127.0.0.1:0", ServerConfig{Memory: &testMem{base: remote}, MaxConns: 6, MaxConnsPerPeer: 4,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	defer s.Close()
	addr := s.Addr().String()
	want := remote[:8:8]

	// The flooding peer: four connections served, the fifth refused.
	var flood []net.Conn
	for range 4 {
		c := dialFrom(t, "127.0.0.2", addr)
		require.NoError(t, readOnce(c, base, want))
		flood = append(flood, c)
	}
	extra := dialFrom(t, "127.0.0.2", addr)
	err = readOnce(extra, base, want)
	require.Error(t, err, "a fifth connection from one peer was served")
	assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE),
		"refused by hanging up, not by timing out: %v", err)
	assert.Contains(t, logs.String(), "4 connections open from 127.0.0.2, the per-peer limit")
	assert.Equal(t, uint64(1), s.Refused())

	// A legitimate client, from another address, still transfers.
	c := NewClient(ClientConfig{Lanes: 1})
	defer c.Close()
	p, err := c.Peer([]string{addr})
	require.NoError(t, err)
	local := make([]byte, 4096)
	done := make(chan error, 1)
	p.Submit(context.Background(), &transport.Slice{Op: transport.Read, Local: uintptr(unsafe.Pointer(&local[0])),
		Remote: base + 4096, Length: uint64(len(local)), Deadline: time.Now().Add(10 * time.Second),
		Done: func(_ *transport.Slice, err error) { done <- err }})
	require.NoError(t, <-done)
	assert.Equal(t, remote[4096:8192], local)

	// 4 + 1 lane: one more peer fills the total; after it, no one gets in.
	require.NoError(t, readOnce(dialFrom(t, "127.0.0.3", addr), base, want))
	require.Error(t, readOnce(dialFrom(t, "127.0.0.4", addr), base, want), "a seventh connection was served")
	assert.Equal(t, uint64(2), s.Refused())

	// A connection of the flooding peer that ends frees its place.
	flood[0].Close()
	require.Eventually(t, func() bool {
		return readOnce(dialFrom(t, "127.0.0.2", addr), base, want) == nil
	}, 10*time.Second, 10*time.Millisecond)
}
