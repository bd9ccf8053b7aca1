package nettest

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards the TCP connections it accepts on loopback to a target
// address. Each direction has a gate: while a test holds it, the bytes of
// that direction wait in the proxy, as on a path that stalled, and go on
// in order once it is released.
type Proxy struct {
	ln   net.Listener
	to   sync.RWMutex // bytes to the target
	from sync.RWMutex // bytes from the target
}

// NewProxy starts a Proxy to target, closed with its connections when the
// test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("nettest: proxy: %v", err)
	}
	p := &Proxy{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
			go pump(s, c, &p.to)
			go pump(c, s, &p.from)
		}
	}()
	return p
}

// pump copies src to dst, each write under gate's read lock, and closes
// dst when src ends.
func pump(dst, src net.Conn, gate *sync.RWMutex) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		gate.RLock()
		if n > 0 {
			_, _ = dst.Write(buf[:n])
		}
		gate.RUnlock()
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// Addr is the address to dial instead of the target's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// HoldRequests stops the bytes to the target until release is called.
func (p *Proxy) HoldRequests() (release func()) {
	p.to.Lock()
	return sync.OnceFunc(p.to.Unlock)
}

// HoldAnswers stops the bytes from the target until release is called.
func (p *Proxy) HoldAnswers() (release func()) {
	p.from.Lock()
	return sync.OnceFunc(p.from.Unlock)
}
