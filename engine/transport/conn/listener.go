package conn

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Limits caps the connections a Listener serves at once, so that a peer
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

// Listener accepts connections and serves each on its own goroutine, within
// its Limits. Close stops accepting, cuts every connection and waits for
// their goroutines: the shape every server of the engine shares.
type Listener struct {
	ln     net.Listener
	handle func(net.Conn)
	lim    Limits
	log    *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	peers  map[netip.Addr]int // connections served, by remote IP
	closed bool
	wg     sync.WaitGroup

	refused atomic.Uint64
	// The accept goroutine's own: when it last logged a refusal, and the
	// refusals since, so that a flood logs a line a second, not one each.
	lastLog  time.Time
	unlogged int
}

// Serve takes ownership of ln and calls handle for each accepted connection
// (maxConns <= 0 means no limit); the connection is closed when handle
// returns.
func Serve(ln net.Listener, maxConns int, log *slog.Logger, handle func(net.Conn)) *Listener {
	return ServeLimits(ln, Limits{Total: maxConns}, log, handle)
}

// ServeLimits is Serve with limits on the connections in total and per
// peer.
func ServeLimits(ln net.Listener, lim Limits, log *slog.Logger, handle func(net.Conn)) *Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Listener{ln: ln, handle: handle, lim: lim, log: log,
		conns: map[net.Conn]struct{}{}, peers: map[netip.Addr]int{}}
	l.wg.Add(1)
	go l.accept()
	return l
}

// Addr is the listening address.
func (l *Listener) Addr() *net.TCPAddr { return l.ln.Addr().(*net.TCPAddr) }

// Refused is the number of connections closed unserved for being over a
// limit since the Listener started.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Close is idempotent.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	err := l.ln.Close()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// peerOf is the remote IP of c; the zero Addr for a connection that is not
// over IP, which the per-peer limit then counts as one peer.
func peerOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

func (l *Listener) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.log.Warn("accept", "addr", l.ln.Addr(), "err", err)
			time.Sleep(10 * time.Millisecond) // EMFILE and friends: back off
			continue
		}
		peer := peerOf(c)
		l.mu.Lock()
		var over string
		switch {
		case l.closed:
			l.mu.Unlock()
			c.Close()
			continue
		case l.lim.Total > 0 && len(l.conns) >= l.lim.Total:
			over = fmt.Sprintf("%d connections open, the limit", l.lim.Total)
		case l.lim.PerPeer > 0 && l.peers[peer] >= l.lim.PerPeer:
			over = fmt.Sprintf("%d connections open from %s, the per-peer limit", l.lim.PerPeer, peer)
		}
		if over != "" {
			l.mu.Unlock()
			l.refuse(c, over)
			continue
		}
		l.conns[c] = struct{}{}
		l.peers[peer]++
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serve(c, peer)
	}
}

// refuse closes c, over a limit, and logs why: the first refusal, then at
// most a line a second saying how many there were since.
func (l *Listener) refuse(c net.Conn, why string) {
	c.Close()
	l.refused.Add(1)
	l.unlogged++
	if now := time.Now(); now.Sub(l.lastLog) >= time.Second {
		l.log.Warn("refused connection", "addr", l.ln.Addr(), "remote", c.RemoteAddr(), "reason", why,
			"refused", l.unlogged)
		l.lastLog, l.unlogged = now, 0
	}
}

func (l *Listener) serve(c net.Conn, peer netip.Addr) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		if l.peers[peer]--; l.peers[peer] == 0 {
			delete(l.peers, peer)
		}
		l.mu.Unlock()
		c.Close()
	}()
	l.handle(c)
}
