package metadata

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServerConnectionsPerPeer keeps ServerMaxConnsPerPeer keep-alive
// connections open from one address: the next is closed unanswered, and
// another address is still served.
func TestServerConnectionsPerPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- NewServer().Serve(ctx, ln) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	// health asks /health on a new connection from 127.0.0.2, left open,
	// and returns the status line ("" when the server hung up).
	health := func() string {
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: m\r\n\r\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "hung up, not timed out")
			return ""
		}
		return strings.TrimSpace(line)
	}
	for i := range ServerMaxConnsPerPeer {
		require.Equal(t, "HTTP/1.1 200 OK", health(), "connection %d", i)
	}
	assert.Empty(t, health(), "a connection over the per-peer limit was served")

	resp, err := http.Get("http://" + ln.Addr().String() + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}
