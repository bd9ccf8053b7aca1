package tcp

import (
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
	peers   map[string]*peer
	closed  bool
	closing chan struct{}
	submits sync.WaitGroup // Submit calls in progress
}

// NewClient returns a client with no connections; lanes dial on first use.
func NewClient(cfg ClientConfig) *Client {
	if cfg.Lanes <= 0 {
		cfg.Lanes = 4
	}
	if cfg.Depth <= 0 {
		cfg.Depth = 4
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
	return &Client{cfg: cfg, peers: make(map[string]*peer), closing: make(chan struct{})}
}

// Name implements transport.Transport.
func (c *Client) Name() string { return "tcp" }

// Submit hands s to the lanes of the peer served at addrs ("host:port",
// tried in turn on retries). It blocks while the peer's queue is full, at
// most until s.Deadline; s.Done is always called exactly once.
func (c *Client) Submit(addrs []string, s *transport.Slice) {
	c.mu.Lock()
	if c.closed || len(addrs) == 0 {
		c.mu.Unlock()
		if len(addrs) == 0 {
			s.Done(s, fmt.Errorf("%w: peer has no TCP address", transport.ErrPeer))
		} else {
			s.Done(s, transport.ErrClosed)
		}
		return
	}
	key := strings.Join(addrs, ",")
	p := c.peers[key]
	if p == nil {
		p = c.newPeer(key, addrs)
		c.peers[key] = p
	}
	c.submits.Add(1)
	c.mu.Unlock()
	defer c.submits.Done()
	p.enqueue(s)
}

// Forget closes the lanes of the peer served at addrs (after its segment is
// closed); slices still queued for it fail.
func (c *Client) Forget(addrs []string) {
	c.mu.Lock()
	p := c.peers[strings.Join(addrs, ",")]
	delete(c.peers, strings.Join(addrs, ","))
	c.mu.Unlock()
	if p != nil {
		p.stop()
	}
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
	c.submits.Wait()
	for _, p := range peers {
		p.stop()
	}
	return nil
}

type peer struct {
	c     *Client
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
}

func (c *Client) newPeer(key string, addrs []string) *peer {
	p := &peer{c: c, addrs: addrs, queue: make(chan *transport.Slice, c.cfg.QueueLen), stopc: make(chan struct{})}
	for i := range c.cfg.Lanes {
		l := &lane{p: p, idx: i}
		p.running.Add(1)
		go l.run()
	}
	c.cfg.Logger.Debug("tcp: new peer", "peer", key, "lanes", c.cfg.Lanes)
	return p
}

// stop ends the peer's goroutines and fails what is still queued.
func (p *peer) stop() {
	p.once.Do(func() { close(p.stopc) })
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
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

// enqueue admits s, blocking while the queue is full, until s.Deadline.
func (p *peer) enqueue(s *transport.Slice) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.stopped {
		s.Done(s, transport.ErrClosed)
		return
	}
	select {
	case p.queue <- s:
		return
	default:
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
func (p *peer) fail(s *transport.Slice, err error) {
	switch {
	case errors.Is(err, transport.ErrRejected), errors.Is(err, transport.ErrClosed),
		errors.Is(err, transport.ErrTimeout), errors.Is(err, ErrMalformed):
		s.Done(s, err)
		return
	case !time.Now().Before(s.Deadline):
		s.Done(s, fmt.Errorf("%w: %v", transport.ErrTimeout, err))
		return
	}
	s.Retries++
	if s.Retries > p.c.cfg.MaxRetries {
		s.Done(s, fmt.Errorf("%w after %d attempts: %v", transport.ErrPeer, s.Retries, err))
		return
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.stopped {
		s.Done(s, transport.ErrClosed)
		return
	}
	select {
	case p.queue <- s:
	default:
		// Never block an I/O goroutine on a full queue: hand off.
		p.running.Add(1)
		go func() {
			defer p.running.Done()
			p.enqueue(s)
		}()
	}
}

// lane owns one connection at a time. Its goroutine writes requests; a
// reader goroutine per connection reads status frames and READ payloads in
// the order the requests went out.
type lane struct {
	p   *peer
	idx int
	hdr [HeaderSize]byte
}

type laneConn struct {
	conn     net.Conn
	inflight chan *transport.Slice
	dead     chan struct{}
	once     sync.Once
	err      error
}

func (lc *laneConn) kill(err error) {
	lc.once.Do(func() {
		lc.err = err
		close(lc.dead)
		lc.conn.Close()
	})
}

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
		if lc != nil {
			select {
			case <-lc.dead:
				close(lc.inflight)
				lc = nil
			default:
			}
		}
		if lc == nil {
			var err error
			if lc, err = l.dial(s); err != nil {
				p.fail(s, err)
				continue
			}
		}
		// Send first, then hand s to the reader: a WRITE's payload must be
		// on the wire before anything can report it done.
		if err := l.send(lc.conn, s); err != nil {
			err = fmt.Errorf("%w: %v", transport.ErrPeer, err)
			lc.kill(err)
			p.fail(s, err)
			continue
		}
		select {
		case lc.inflight <- s:
		case <-lc.dead:
			p.fail(s, lc.err)
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
	lc := &laneConn{conn: conn, inflight: make(chan *transport.Slice, p.c.cfg.Depth), dead: make(chan struct{})}
	p.running.Add(1)
	go l.read(lc)
	return lc, nil
}

func (l *lane) send(conn net.Conn, s *transport.Slice) error {
	op := uint8(opRead)
	if s.Op == transport.Write {
		op = opWrite
	}
	PutHeader(l.hdr[:], Header{Size: s.Length, Addr: s.Remote, Op: op, V2: !l.p.c.cfg.V1})
	conn.SetWriteDeadline(s.Deadline)
	if s.Op == transport.Read {
		_, err := conn.Write(l.hdr[:])
		return err
	}
	bufs := net.Buffers{l.hdr[:], transport.Bytes(s.Local, s.Length)}
	_, err := bufs.WriteTo(conn)
	return err
}

// read settles in-flight slices in wire order until the writer closes the
// inflight channel. After the connection dies the remaining slices are
// failed for retry without touching the socket.
func (l *lane) read(lc *laneConn) {
	p := l.p
	defer p.running.Done()
	v2 := !p.c.cfg.V1
	var st [StatusSize]byte
	for s := range lc.inflight {
		select {
		case <-lc.dead:
			p.fail(s, lc.err)
			continue
		default:
		}
		lc.conn.SetReadDeadline(s.Deadline)
		err := l.recv(lc.conn, s, v2, st[:])
		if err == nil {
			s.Done(s, nil)
			continue
		}
		if errors.Is(err, transport.ErrRejected) {
			s.Done(s, err) // the stream is still in step
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("%w: no answer from %s", transport.ErrTimeout, lc.conn.RemoteAddr())
		} else if !errors.Is(err, ErrMalformed) {
			err = fmt.Errorf("%w: %v", transport.ErrPeer, err)
		}
		lc.kill(err)
		p.fail(s, err)
	}
}

func (l *lane) recv(conn net.Conn, s *transport.Slice, v2 bool, st []byte) error {
	if v2 {
		if _, err := io.ReadFull(conn, st); err != nil {
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
		_, err := io.ReadFull(conn, transport.Bytes(s.Local, s.Length))
		return err
	}
	return nil // a v1 WRITE has nothing to read back
}
