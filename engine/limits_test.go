package engine_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
)

// TestConnectionsPerPeer floods an engine's data port from one address
// with raw sockets, four times its per-peer limit: the engine serves as
// many as the limit (it sends them its challenge), hangs up on the rest,
// and another engine still transfers to it, bytes intact.
func TestConnectionsPerPeer(t *testing.T) {
	const limit = 4
	target := newEngine(t, engine.Config{Transport: "tcp", Secret: "s", MaxConnsPerPeer: limit})
	init := newEngine(t, engine.Config{Transport: "tcp", Secret: "s"})
	data := fmt.Sprintf("127.0.0.1:%d", target.DataPort())
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	nonce := make([]byte, 32)
	served := 0
	for i := range 4 * limit {
		c, err := d.Dial("tcp", data)
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2: %v", err)
		}
		defer c.Close()
		// A served connection gets the challenge and keeps it for
		// conn.AuthTimeout (5 s): well past this loop.
		c.SetReadDeadline(time.Now().Add(4 * time.Second))
		if _, err := io.ReadFull(c, nonce); err == nil {
			served++
		} else {
			require.ErrorIs(t, err, io.EOF, "connection %d: refused by hanging up", i)
		}
	}
	require.Equal(t, limit, served, "connections served from one peer")

	const n = 1 << 20
	dst := anonMem(t, n)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(dst), n, "cpu:0", true))
	src := anonMem(t, 2*n)
	rand.Read(src[:n])
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 2*n, "", true))
	seg, err := init.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)
	st := transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(dst)), Length: n}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	st = transfer(t, init, []engine.Request{{Op: engine.Read, Local: addr(src[n:]), Segment: seg, Remote: uint64(addr(dst)), Length: n}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.True(t, bytes.Equal(src[:n], src[n:]))
}
