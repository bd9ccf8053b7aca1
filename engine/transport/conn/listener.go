package conn

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Listener accepts connections and serves each on its own goroutine, within
// its Limits. Close stops accepting, cuts every connection and waits for
// their goroutines: the shape every server of the engine shares.
type Listener struct {
	ln     net.Listener
	handle func(net.Conn)
	lim    *limiter
	log    *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
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
	l := &Listener{ln: ln, handle: handle, lim: newLimiter(lim, log), log: log, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	return l
}

// Addr is the listening address.
func (l *Listener) Addr() *net.TCPAddr { return l.ln.Addr().(*net.TCPAddr) }

// Refused is the number of connections closed unserved for being over a
// limit since the Listener started.
func (l *Listener) Refused() uint64 { return l.lim.refused.Load() }

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
		peer, ok := l.lim.take(c, l.ln.Addr())
		if !ok {
			c.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			l.lim.release(peer)
			c.Close()
			continue
		}
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.serve(c, peer)
	}
}

func (l *Listener) serve(c net.Conn, peer netip.Addr) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		l.lim.release(peer)
		c.Close()
	}()
	l.handle(c)
}
