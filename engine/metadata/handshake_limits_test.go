package metadata

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHandshakeConnectionsPerPeer has one peer open more handshake
// connections than the per-peer limit and leave them idle: those within
// the limit are served (the server sends its challenge), the next is
// closed unserved, and another peer's handshake still goes through.
func TestHandshakeConnectionsPerPeer(t *testing.T) {
	s, err := ServeHandshake("127.0.0.1:0", echo, []byte("k"), nil)
	require.NoError(t, err)
	defer s.Close()
	addr := s.Addr().String()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	dial := func() net.Conn {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		// Served connections get the challenge at once, and keep it for
		// AuthTimeout (5 s) waiting for an answer: the test runs within.
		c.SetReadDeadline(time.Now().Add(4 * time.Second))
		return c
	}
	nonce := make([]byte, 32)
	for i := range HandshakeMaxConnsPerPeer {
		_, err := io.ReadFull(dial(), nonce)
		require.NoError(t, err, "connection %d was not served", i)
	}
	_, err = io.ReadFull(dial(), nonce)
	require.Error(t, err, "a connection over the per-peer limit was served")
	assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET), "refused by hanging up: %v", err)
	assert.Equal(t, uint64(1), s.Refused())

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	reply, err := Call(ctx, addr, TypeProbe, []byte(`{}`), []byte("k"))
	require.NoError(t, err)
	assert.Equal(t, `{"echo":{}}`, string(reply))
}
