package conn

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLimitListener plays several peers from loopback addresses against
// a listener with room for three connections, two per peer: each
// connection it lets in is greeted, one over a limit is closed unserved,
// and a closed connection makes room again.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ll := Limit(inner, Limits{Total: 3, PerPeer: 2}, nil)
	defer ll.Close()
	accepted := make(chan net.Conn)
	go func() {
		for {
			c, err := ll.Accept()
			if err != nil {
				close(accepted)
				return
			}
			c.Write([]byte("hi"))
			accepted <- c
		}
	}()
	// dial connects from ip and says whether the listener let it in.
	dial := func(ip string) bool {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", ll.Addr().String())
		if err != nil {
			t.Skipf("cannot dial from %s: %v", ip, err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(io.LimitReader(c, 2))
		require.NoError(t, err)
		return string(b) == "hi"
	}
	require.True(t, dial("127.0.0.2"))
	first := <-accepted
	require.True(t, dial("127.0.0.2"))
	<-accepted
	assert.False(t, dial("127.0.0.2"), "a third connection from one peer")
	require.True(t, dial("127.0.0.3"))
	<-accepted
	assert.False(t, dial("127.0.0.4"), "a fourth connection in all")
	assert.Equal(t, uint64(2), ll.Refused())
	assert.Equal(t, 3, ll.Open())

	// Closing one makes room for its peer; closing twice counts once.
	require.NoError(t, first.Close())
	first.Close()
	assert.Equal(t, 2, ll.Open())
	require.True(t, dial("127.0.0.2"))
	<-accepted
	assert.Equal(t, 3, ll.Open())
}

// TestLimitListenerCloseWrite checks that a connection keeps its TCP
// half-close, which net/http uses before hanging up on a refused request.
func TestLimitListenerCloseWrite(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ll := Limit(inner, Limits{}, nil)
	defer ll.Close()
	c, err := net.Dial("tcp", ll.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	sc, err := ll.Accept()
	require.NoError(t, err)
	defer sc.Close()
	cw, ok := sc.(interface{ CloseWrite() error })
	require.True(t, ok, "no CloseWrite")
	require.NoError(t, cw.CloseWrite())
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the write side was not closed")
	// The other direction still works.
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = io.ReadFull(sc, b)
	require.NoError(t, err)
}
