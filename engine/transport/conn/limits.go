package conn

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Limits caps the connections a server holds at once, so that a peer
// that opens connections and never closes them costs a bounded number of
// file descriptors and goroutines, and, with PerPeer, leaves room for the
// others. A connection over a limit is closed as soon as it is accepted,
// and the refusal logged. Zero (or negative) fields mean no limit.
type Limits struct {
	// Total caps the connections from every peer together.
	Total int
	// PerPeer caps the connections from one remote IP address.
	PerPeer int
}

// limiter counts the open connections against Limits.
type limiter struct {
	lim Limits
	log *slog.Logger

	mu    sync.Mutex
	open  int
	peers map[netip.Addr]int // open connections by remote IP

	refused atomic.Uint64
	// When a refusal was last logged, and the refusals since, so that a
	// flood logs a line a second, not one each.
	logMu    sync.Mutex
	lastLog  time.Time
	unlogged int
}

func newLimiter(lim Limits, log *slog.Logger) *limiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &limiter{lim: lim, log: log, peers: map[netip.Addr]int{}}
}

// peerOf is the remote IP of c; the zero Addr for a connection that is not
// over IP, which the per-peer limit then counts as one peer.
func peerOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// take counts c in, or, over a limit, logs why and reports false; the
// caller closes it then.
func (l *limiter) take(c net.Conn, local net.Addr) (netip.Addr, bool) {
	peer := peerOf(c)
	l.mu.Lock()
	var over string
	switch {
	case l.lim.Total > 0 && l.open >= l.lim.Total:
		over = fmt.Sprintf("%d connections open, the limit", l.lim.Total)
	case l.lim.PerPeer > 0 && l.peers[peer] >= l.lim.PerPeer:
		over = fmt.Sprintf("%d connections open from %s, the per-peer limit", l.lim.PerPeer, peer)
	default:
		l.open++
		l.peers[peer]++
	}
	l.mu.Unlock()
	if over == "" {
		return peer, true
	}
	l.refused.Add(1)
	l.logMu.Lock()
	defer l.logMu.Unlock()
	l.unlogged++
	if now := time.Now(); now.Sub(l.lastLog) >= time.Second {
		l.log.Warn("refused connection", "addr", local, "remote", c.RemoteAddr(), "reason", over, "refused", l.unlogged)
		l.lastLog, l.unlogged = now, 0
	}
	return peer, false
}

// release counts out a connection take let in.
func (l *limiter) release(peer netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.peers[peer]--; l.peers[peer] == 0 {
		delete(l.peers, peer)
	}
}

// LimitListener is a net.Listener that closes the connections over its
// Limits as it accepts them, logging why, for servers with an accept loop
// of their own (net/http, gRPC). A connection counts until it is closed.
type LimitListener struct {
	net.Listener
	l *limiter
}

// Limit wraps ln; log receives the refusals (nil: none).
func Limit(ln net.Listener, lim Limits, log *slog.Logger) *LimitListener {
	return &LimitListener{Listener: ln, l: newLimiter(lim, log)}
}

// Accept returns the next connection within the limits.
func (ll *LimitListener) Accept() (net.Conn, error) {
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer, ok := ll.l.take(c, ll.Addr())
		if !ok {
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, release: func() { ll.l.release(peer) }}, nil
	}
}

// Refused is the number of connections closed unserved so far.
func (ll *LimitListener) Refused() uint64 { return ll.l.refused.Load() }

// Open is the number of connections accepted and not yet closed.
func (ll *LimitListener) Open() int {
	ll.l.mu.Lock()
	defer ll.l.mu.Unlock()
	return ll.l.open
}

// limitedConn gives its place back on its first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// CloseWrite half-closes a TCP connection, as net/http does before it
// closes one whose request it refused (so the answer is not lost to a
// reset). A wrapper must pass it on: net/http looks for the method.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
