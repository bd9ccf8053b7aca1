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

	mu   sync.Mutex
	held []func() // the releases of the holds, run at the end of the test
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
	t.Cleanup(func() {
		_ = ln.Close()
		// A test that failed while holding a direction must not leave
		// the pumps blocked behind it.
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, release := range p.held {
			release()
		}
	})
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

// HoldRequests stops the bytes to the target until release is called (or
// the test ends).
func (p *Proxy) HoldRequests() (release func()) { return p.hold(&p.to) }

// HoldAnswers stops the bytes from the target until release is called (or
// the test ends).
func (p *Proxy) HoldAnswers() (release func()) { return p.hold(&p.from) }

func (p *Proxy) hold(gate *sync.RWMutex) func() {
	gate.Lock()
	release := sync.OnceFunc(gate.Unlock)
	p.mu.Lock()
	p.held = append(p.held, release)
	p.mu.Unlock()
	return release
}
