package tcp

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine/transport"
)

// cutter accepts connections on addr and relays them to target, but hangs
// up each after forwarding limit bytes of the answers: a link lost in the
// middle of a READ's payload.
func cutter(t *testing.T, addr, target string, limit int64) string {
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
			go func() {
				defer wg.Done()
				_, _ = io.CopyN(c, up, limit)
				c.Close()
				up.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestReadCutMidPayloadMovesPath: a READ whose answer stops half way (its
// connection lost) is retried on the peer's other address; its Done is
// called once, with the right bytes, and nothing lands in the local
// buffer after that (the caller reuses it at once).
func TestReadCutMidPayloadMovesPath(t *testing.T) {
	remote := make([]byte, 1<<20)
	for i := range remote {
		remote[i] = byte(i * 13)
	}
	s := startServer(t, &testMem{base: remote})
	bad := cutter(t, "127.0.0.1:0", s.Addr().String(), StatusSize+20<<10)
	good := startRelay(t, "127.0.0.2:0", s.Addr().String(), nil)
	c := NewClient(ClientConfig{Lanes: 1})
	p, err := c.Peer([]string{bad, good.ln.Addr().String()})
	require.NoError(t, err)
	pr := &pair{c: c, p: p, local: make([]byte, 1<<20), remote: remote}
	const n = 64 << 10
	var calls atomic.Int32
	got := make(chan error, 4)
	sl, _ := pr.slice(transport.Read, 0, n)
	sl.Done = func(_ *transport.Slice, err error) {
		calls.Add(1)
		if err == nil {
			// The caller takes the buffer back at once.
			require.True(t, bytes.Equal(served(0, n), pr.local[:n]), "bytes read")
			for i := range n {
				pr.local[i] = 0xEE
			}
		}
		got <- err
	}
	p.Submit(context.Background(), sl)
	require.NoError(t, <-got)
	require.Equal(t, 1, sl.Retries, "retried once, on the other address")
	c.Close() // waits for every goroutine: no Done or byte can come later
	require.Equal(t, int32(1), calls.Load(), "Done calls")
	require.Equal(t, bytes.Repeat([]byte{0xEE}, n), pr.local[:n], "bytes landed after Done")
	require.NotEmpty(t, good.from(), "the retry went to the other address")
}
