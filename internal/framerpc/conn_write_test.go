package framerpc

import (
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// A server that stopped reading (a frozen process: its kernel still
// acknowledges, its socket buffers are full) holds the call whose frame
// is being written for 15-30 s (writeDeadline); the calls behind that write end
// at their own deadlines, as gRPC's do while they wait for flow control,
// so that the client's heartbeat and retries (a failover under HA) are
// not held 30 s behind it.
func TestCallsBehindABlockedWriteEndAtTheirDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	peer := make(chan net.Conn, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		head := make([]byte, len(Preface))
		if _, err := io.ReadFull(nc, head); err == nil {
			_, _ = nc.Write(head)
		}
		peer <- nc // and never read again
	}()
	t.Cleanup(func() {
		select {
		case nc := <-peer:
			_ = nc.Close()
		default:
		}
	})
	c := newConn(t, ln.Addr().String(), ConnConfig{})

	big := make(chan error, 1)
	go func() {
		_, err := rpc(ctxTimeout(t, time.Minute), c, make([]byte, 64<<20))
		big <- err
	}()
	// Its frame is more than the sockets hold: once it has the wire's
	// write lock it keeps it.
	eventually(t, 10*time.Second, "the large call's write to block", func() bool {
		c.mu.Lock()
		w := c.wire
		c.mu.Unlock()
		if w == nil {
			return false
		}
		if w.wmu.TryLock() {
			w.wmu.Unlock()
			return false
		}
		return true
	})

	start := time.Now()
	_, err = rpc(ctxTimeout(t, 300*time.Millisecond), c, []byte("small"))
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a call with a 300 ms deadline behind a blocked write returned after %v", d.Round(time.Millisecond))
	}
	wantCode(t, err, codes.DeadlineExceeded)

	_ = c.Close()
	wantCode(t, <-big, codes.Canceled)
}
