package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/engine/transport"
)

// ClientConfig configures the initiating side of the TCP transport.
type ClientConfig struct {
	// Lanes is the number of persistent connections per peer. Zero means 4
	// (Mooncake's MC_TCP_LANES_PER_PEER default).
	Lanes int
	// Depth is how many slices one lane keeps on the wire before waiting for
	// their status frames. Zero means 4.
	Depth int
	// QueueLen bounds the slices admitted per peer and not yet on a lane;
	// Submit blocks (until the slice deadline) while it is full. Zero means
	// 1024 (MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER).
	QueueLen int
	// MaxRetries is how many times a slice that failed on a broken connection
	// is tried again, on another lane or address. Zero means 3.
	MaxRetries int
	// DialTimeout bounds connecting a lane. Zero means 5 s.
	DialTimeout time.Duration
	// Secret, when set, is proven to every peer before the first frame.
	Secret []byte
	// V1 speaks protocol version 1 (no status frames), as MC_TCP_PROTO=1.
	V1     bool
	Logger *slog.Logger
}

// Client sends slices to peers over persistent lanes. Each peer has one
// bounded queue that all its lanes pull from, so a large request cut into
// slices spreads over every lane and a slow lane never holds work back.
type Client struct {
	cfg ClientConfig

	mu      sync.Mutex
	peers   map[string]*Peer
	closed  bool
	closing chan struct{}
}

// NewClient returns a client with no connections; lanes dial on first use.
func NewClient(cfg ClientConfig) *Client {
	if cfg.Lanes <= 0 {
		cfg.Lanes = 4
	}
	if cfg.Depth <= 0 {
		cfg.Depth = 16
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 1024
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = 3
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Client{cfg: cfg, peers: make(map[string]*Peer), closing: make(chan struct{})}
}

// Name implements transport.Transport.
func (c *Client) Name() string { return "tcp" }

// Peer returns the lanes of the peer served at addrs ("host:port", tried
// in turn on retries), starting them on first use. Callers resolve it once
// per segment, so submitting takes no lock of the client.
func (c *Client) Peer(addrs []string) (*Peer, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: peer has no TCP address", transport.ErrPeer)
	}
	key := strings.Join(addrs, ",")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, transport.ErrClosed
	}
	p := c.peers[key]
	if p == nil {
		p = c.newPeer(key, addrs)
		c.peers[key] = p
	}
	return p, nil
}

// Submit hands s to the peer's lanes. It blocks while the peer's queue is
// full, at most until s.Deadline; s.Done is always called exactly once,
// with transport.ErrClosed once the peer is forgotten or the client closed.
func (p *Peer) Submit(s *transport.Slice) { p.enqueue(s) }

// Forget closes the peer's lanes (after its segment is closed); slices
// still queued for it fail.
func (c *Client) Forget(p *Peer) {
	c.mu.Lock()
	if c.peers[p.key] == p {
		delete(c.peers, p.key)
	}
	c.mu.Unlock()
	p.stop()
}

// Close fails every queued and in-flight slice with transport.ErrClosed and
// waits for every goroutine of every peer.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
	peers := c.peers
	c.peers = nil
	c.mu.Unlock()
	// A Submit in progress holds its peer's mu, which stop waits for.
	for _, p := range peers {
		p.stop()
	}
	return nil
}

// Peer is one peer's lanes and their shared queue.
type Peer struct {
	c     *Client
	key   string
	addrs []string
	queue chan *transport.Slice
	stopc chan struct{}
	once  sync.Once

	// mu is held for reading by everything that may put a slice in queue,
	// and for writing by stop, so that once stop has drained the queue
	// nothing can land in it any more.
	mu      sync.RWMutex
	stopped bool
	// running counts lane writers, their readers and retry hand-offs.
	running sync.WaitGroup

	connMu sync.Mutex
	conns  map[*laneConn]struct{} // nil once stopped
}

// track records a live connection so stop can cut it; false once stopped.
func (p *Peer) track(lc *laneConn) bool {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[lc] = struct{}{}
	return true
}

func (p *Peer) untrack(lc *laneConn) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	delete(p.conns, lc)
}

func (c *Client) newPeer(key string, addrs []string) *Peer {
	p := &Peer{c: c, key: key, addrs: addrs, queue: make(chan *transport.Slice, c.cfg.QueueLen), stopc: make(chan struct{}),
		conns: map[*laneConn]struct{}{}}
	for i := range c.cfg.Lanes {
		l := &lane{p: p, idx: i}
		p.running.Add(1)
		go l.run()
	}
	c.cfg.Logger.Debug("tcp: new peer", "peer", key, "lanes", c.cfg.Lanes)
	return p
}

// stop ends the peer's goroutines and fails what is still queued.
func (p *Peer) stop() {
	p.once.Do(func() { close(p.stopc) })
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	// Readers still draining retired connections would otherwise wait out
	// their slices' deadlines.
	p.connMu.Lock()
	for lc := range p.conns {
		lc.kill(transport.ErrClosed)
	}
	p.conns = nil
	p.connMu.Unlock()
	p.running.Wait()
	for {
		select {
		case s := <-p.queue:
			s.Done(s, transport.ErrClosed)
		default:
			return
		}
	}
}

// offer queues s if there is room, without waiting, and reports whether s
// is taken care of: queued, or failed because the peer stopped. The caller
// holds p.mu for reading.
func (p *Peer) offer(s *transport.Slice) bool {
	if p.stopped {
		s.Done(s, transport.ErrClosed)
		return true
	}
	select {
	case p.queue <- s:
		return true
	default:
		return false
	}
}

// enqueue admits s, blocking while the queue is full, until s.Deadline.
func (p *Peer) enqueue(s *transport.Slice) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.offer(s) {
		return
	}
	t := time.NewTimer(time.Until(s.Deadline))
	defer t.Stop()
	select {
	case p.queue <- s:
	case <-t.C:
		s.Done(s, fmt.Errorf("%w: peer queue full", transport.ErrTimeout))
	case <-p.stopc:
		s.Done(s, transport.ErrClosed)
	case <-p.c.closing:
		s.Done(s, transport.ErrClosed)
	}
}

// fail settles a slice that did not complete: a rejection, an expired
// deadline or a closed transport is final; a broken connection is retried on
// another lane (and, with several addresses, another address), bounded.
func (p *Peer) fail(s *transport.Slice, err error) {
	switch {
	case errors.Is(err, transport.ErrRejected), errors.Is(err, transport.ErrClosed),
		errors.Is(err, transport.ErrTimeout), errors.Is(err, ErrMalformed):
		s.Done(s, err)
		return
	case !time.Now().Before(s.Deadline):
		s.Done(s, fmt.Errorf("%w: %v", transport.ErrTimeout, err))
		return
	}
	if !errors.Is(err, errUnanswered) {
		s.Retries++
	}
	if s.Retries > p.c.cfg.MaxRetries {
		s.Done(s, fmt.Errorf("%w after %d attempts: %v", transport.ErrPeer, s.Retries, err))
		return
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.offer(s) {
		return
	}
	// Never block an I/O goroutine on a full queue: hand off.
	p.running.Add(1)
	go func() {
		defer p.running.Done()
		p.enqueue(s)
	}()
}

// lane owns one connection at a time. Its goroutine writes requests; a
// reader goroutine per connection reads status frames and READ payloads in
// the order the requests went out.
type lane struct {
	p    *Peer
	idx  int
	hdrs [maxGather][HeaderSize]byte
	sl   []*transport.Slice
	bufs net.Buffers
}

// maxGather bounds the slices one lane sends with a single writev.
const maxGather = 16

type laneConn struct {
	conn     net.Conn
	br       *bufio.Reader // status frames arriving together cost one read
	inflight chan *transport.Slice
	dead     chan struct{} // closed by kill
	once     sync.Once
	err      error
	retired  chan struct{} // closed by the reader after a refusal
	retire   sync.Once
}

func (lc *laneConn) kill(err error) {
	lc.once.Do(func() {
		lc.err = err
		close(lc.dead)
		lc.conn.Close()
	})
}

// usable reports whether the writer may still send on the connection.
func (lc *laneConn) usable() bool {
	select {
	case <-lc.dead:
		return false
	case <-lc.retired:
		return false
	default:
		return true
	}
}

// errUnanswered marks slices lost because the peer hung up after refusing
// an earlier request on the same connection, as Mooncake's server does.
// They are requeued without counting a retry: each refusal settles one
// request for good, so this cannot loop.
var errUnanswered = errors.New("connection closed after a refused request")

func (l *lane) run() {
	p := l.p
	defer p.running.Done()
	var lc *laneConn
	defer func() {
		if lc != nil {
			lc.kill(transport.ErrClosed)
			close(lc.inflight)
		}
	}()
	for {
		var s *transport.Slice
		select {
		case s = <-p.queue:
		case <-p.stopc:
			return
		case <-p.c.closing:
			return
		}
		if !time.Now().Before(s.Deadline) {
			s.Done(s, transport.ErrTimeout)
			continue
		}
		if lc != nil && !lc.usable() {
			close(lc.inflight) // its reader settles what is left, then closes it
			lc = nil
		}
		if lc == nil {
			var err error
			if lc, err = l.dial(s); err != nil {
				p.fail(s, err)
				continue
			}
		}
		// Take what else is queued, up to maxGather, for one writev.
		l.sl = append(l.sl[:0], s)
	gather:
		for len(l.sl) < maxGather {
			select {
			case s2 := <-p.queue:
				if !time.Now().Before(s2.Deadline) {
					s2.Done(s2, transport.ErrTimeout)
					continue
				}
				l.sl = append(l.sl, s2)
			default:
				break gather
			}
		}
		// Send first, then hand the slices to the reader: a WRITE's payload
		// must be on the wire before anything can report it done.
		err := l.send(lc.conn, l.sl)
		if err != nil && p.c.cfg.V1 {
			// v1 acknowledges nothing: what did not go out is lost.
			err = fmt.Errorf("%w: %v", transport.ErrPeer, err)
			lc.kill(err)
			for _, s := range l.sl {
				p.fail(s, err)
			}
			continue
		}
		// Even when the send failed, the peer may have answered part of it
		// (Mooncake's server refuses a WRITE and hangs up without reading
		// its payload): the reader settles each slice from what arrived.
		for _, s := range l.sl {
			select {
			case lc.inflight <- s:
			case <-lc.dead:
				p.fail(s, lc.err)
			}
		}
		if err != nil {
			close(lc.inflight)
			lc = nil
		}
	}
}

func (l *lane) dial(s *transport.Slice) (*laneConn, error) {
	p := l.p
	addr := p.addrs[(l.idx+s.Retries)%len(p.addrs)]
	timeout := min(p.c.cfg.DialTimeout, time.Until(s.Deadline))
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", transport.ErrPeer, addr, err)
	}
	conn.(*net.TCPConn).SetNoDelay(true)
	if err := transport.ClientAuth(conn, p.c.cfg.Secret); err != nil {
		conn.Close()
		// An authentication failure will not heal by retrying.
		return nil, fmt.Errorf("%w: %s: %w", transport.ErrRejected, addr, err)
	}
	lc := &laneConn{conn: conn, br: bufio.NewReaderSize(conn, 4096),
		inflight: make(chan *transport.Slice, p.c.cfg.Depth), dead: make(chan struct{}), retired: make(chan struct{})}
	if !p.track(lc) {
		conn.Close()
		return nil, transport.ErrClosed
	}
	p.running.Add(1)
	go l.read(lc)
	return lc, nil
}

func (l *lane) send(conn net.Conn, sl []*transport.Slice) error {
	l.bufs = l.bufs[:0]
	deadline := sl[0].Deadline
	for i, s := range sl {
		op := uint8(opRead)
		if s.Op == transport.Write {
			op = opWrite
		}
		PutHeader(l.hdrs[i][:], Header{Size: s.Length, Addr: s.Remote, Op: op, V2: !l.p.c.cfg.V1})
		l.bufs = append(l.bufs, l.hdrs[i][:])
		if s.Op == transport.Write {
			l.bufs = append(l.bufs, transport.Bytes(s.Local, s.Length))
		}
		if s.Deadline.Before(deadline) {
			deadline = s.Deadline
		}
	}
	conn.SetWriteDeadline(deadline)
	bufs := l.bufs // WriteTo consumes its receiver
	_, err := bufs.WriteTo(conn)
	return err
}

// read settles in-flight slices in wire order until the writer closes the
// inflight channel, then closes the connection. After the connection dies
// the remaining slices are failed for retry without touching the socket.
func (l *lane) read(lc *laneConn) {
	p := l.p
	defer p.running.Done()
	defer p.untrack(lc)
	defer lc.kill(transport.ErrClosed)
	v2 := !p.c.cfg.V1
	refused := false
	var st [StatusSize]byte
	for s := range lc.inflight {
		select {
		case <-lc.dead:
			p.fail(s, lc.err)
			continue
		default:
		}
		lc.conn.SetReadDeadline(s.Deadline)
		err := l.recv(lc.br, lc.conn, s, v2, st[:])
		if err == nil {
			s.Done(s, nil)
			continue
		}
		if errors.Is(err, transport.ErrRejected) {
			s.Done(s, err)
			// Our server keeps the stream in step after a refusal; Mooncake's
			// hangs up. Settle what is in flight here, send on a new one.
			refused = true
			lc.retire.Do(func() { close(lc.retired) })
			continue
		}
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			err = fmt.Errorf("%w: no answer from %s", transport.ErrTimeout, lc.conn.RemoteAddr())
		case errors.Is(err, ErrMalformed):
		case refused:
			err = fmt.Errorf("%w: %w: %v", transport.ErrPeer, errUnanswered, err)
		default:
			err = fmt.Errorf("%w: %v", transport.ErrPeer, err)
		}
		lc.kill(err)
		p.fail(s, err)
	}
}

func (l *lane) recv(br *bufio.Reader, conn net.Conn, s *transport.Slice, v2 bool, st []byte) error {
	if v2 {
		if _, err := io.ReadFull(br, st); err != nil {
			return err
		}
		ok, err := ParseStatus(st)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s %#x+%d at %s", transport.ErrRejected, s.Op, s.Remote, s.Length, conn.RemoteAddr())
		}
	}
	if s.Op == transport.Read {
		_, err := io.ReadFull(br, transport.Bytes(s.Local, s.Length))
		return err
	}
	return nil // a v1 WRITE has nothing to read back
}
