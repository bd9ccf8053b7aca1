package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/conn"
	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/internal/pathwatch"
)

// ClientConfig configures the initiating side of the TCP transport.
type ClientConfig struct {
	// Lanes is the number of persistent connections per peer. Zero means 4
	// (Mooncake's MC_TCP_LANES_PER_PEER default).
	Lanes int
	// Depth is how many slices one lane keeps on the wire before waiting for
	// their status frames. Zero means 16.
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
	// LocalAddrs are the local IP addresses lanes dial from (the host's
	// NICs), spread over the lanes; with as many peer addresses, lane i
	// pairs local i with peer address i. Zero: the system picks.
	LocalAddrs []string
	// PathTimeout is how long a connection may go without a sign of life
	// from the peer's kernel (data unacknowledged, keepalives unanswered),
	// and a dial may take, before its path counts as down when a peer has
	// more than one (several addresses, or several LocalAddrs): its slices
	// move to another path then, not at their deadline. A peer with a
	// single path waits as long as the slice deadline allows, as before.
	// Zero means 2 s.
	PathTimeout time.Duration
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

// The TCP path implements the engine's transport interfaces, inline sends
// included.
var (
	_ transport.Transport = (*Client)(nil)
	_ transport.Peer      = (*Peer)(nil)
	_ transport.Inliner   = (*Peer)(nil)
)

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
	if cfg.PathTimeout <= 0 {
		cfg.PathTimeout = 2 * time.Second
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
// per segment, so submitting takes no lock of the client. Every Peer call
// takes a reference that Close gives back: the lanes stop with the last.
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
	p.refs++
	return p, nil
}

// Open implements transport.Transport: the peer's lanes over info.Addrs.
func (c *Client) Open(_ context.Context, info transport.PeerInfo) (transport.Peer, error) {
	if len(info.Addrs) == 0 {
		return nil, fmt.Errorf("%w: segment %s publishes no TCP data address", transport.ErrUnavailable, info.Name)
	}
	return c.Peer(info.Addrs)
}

// Submit hands s to the peer's lanes. It blocks while the peer's queue is
// full, at most until s.Deadline or the end of ctx; s.Done is always called
// exactly once, with transport.ErrClosed once the peer is forgotten or the
// client closed.
func (p *Peer) Submit(ctx context.Context, s *transport.Slice) { p.enqueue(ctx, s) }

// Path implements transport.Peer.
func (p *Peer) Path() string { return "tcp" }

// Close implements transport.Peer: it gives back the reference Peer took,
// and the last one stops the lanes; slices still queued for them fail. Two segments served at the
// same addresses share lanes; closing one leaves the other's running.
func (p *Peer) Close() {
	c := p.c
	c.mu.Lock()
	if p.refs--; p.refs > 0 {
		c.mu.Unlock()
		return
	}
	// Out of the map in the same critical section: an opener that comes
	// now starts new lanes rather than taking these as they stop.
	if c.peers[p.key] == p {
		delete(c.peers, p.key)
	}
	c.mu.Unlock()
	p.stop()
}

// SubmitInline is Submit for a caller that will wait for sl itself, in
// order. When sl is small (maxGather slices, maxInlineBytes), the peer's
// queue empty and a lane idle, the calling goroutine writes the requests
// with one writev and they are parked on that connection: the returned
// Inline reads their answers in the caller's goroutine (Wait) or hands them
// to the reader (Release); one of them, or the lane sending more behind
// them, eventually settles them. Otherwise the slices are submitted as by
// Submit and the result is nil. Lanes are tried in order, so a shallow
// queue keeps to the first, warm, connection. SubmitInline keeps sl.
func (p *Peer) SubmitInline(ctx context.Context, sl []*transport.Slice) transport.Inline {
	var bytes uint64
	for _, s := range sl {
		bytes += s.Length
	}
	if !p.c.cfg.V1 && len(sl) <= maxGather && bytes <= maxInlineBytes && len(p.queue) == 0 &&
		time.Now().Before(sl[0].Deadline) {
		for _, l := range p.lanes {
			if in, taken := l.inline(sl); taken {
				if in == nil {
					return nil // a nil *Inline is not a nil interface
				}
				return in
			}
		}
	}
	for _, s := range sl {
		p.enqueue(ctx, s)
	}
	return nil
}

// maxInlineBytes bounds what one inline send carries: a WRITE's payload is
// written by the submitting goroutine before Submit returns, and the server
// answers READs together up to 4 MiB (maxReadBatchBytes).
const maxInlineBytes = 4 << 20

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
	refs  int // Peer calls not yet closed; guarded by c.mu
	key   string
	addrs []string
	queue chan *transport.Slice
	lanes []*lane
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

	// paths are the ways to the peer: each of its addresses, from each
	// local address; the first home of them are where lanes start
	// (lane i at home i mod home), the rest are tried after a failure.
	paths []path
	home  int
	// multipath: there is more than one path, so a dead one is given up
	// on after PathTimeout rather than at the slice deadline.
	multipath bool

	// addrMu guards downUntil: per path, when a failed dial or a
	// connection found dead stops counting against it.
	addrMu    sync.Mutex
	downUntil []time.Time
	downErr   error // why the last path went down
}

// path is one way to a peer: a peer address, dialled from a local address
// ("" lets the system pick).
type path struct {
	addr  int // index into Peer.addrs
	local string
}

func (pt path) name(p *Peer) string {
	if pt.local == "" {
		return p.addrs[pt.addr]
	}
	return pt.local + "->" + p.addrs[pt.addr]
}

// makePaths lists the paths to n peer addresses from locals, the home
// ones first: with as many local addresses as peer addresses, local i to
// peer address i (rail-aligned); with more of either, the fewer taken in
// turn; then every other pairing, for when those fail.
func makePaths(n int, locals []string) (paths []path, home int) {
	if len(locals) == 0 {
		for i := range n {
			paths = append(paths, path{addr: i})
		}
		return paths, n
	}
	home = max(n, len(locals))
	seen := map[path]bool{}
	for k := range home {
		pt := path{addr: k % n, local: locals[k%len(locals)]}
		paths, seen[pt] = append(paths, pt), true
	}
	for i := range n {
		for _, l := range locals {
			if pt := (path{addr: i, local: l}); !seen[pt] {
				paths, seen[pt] = append(paths, pt), true
			}
		}
	}
	return paths, home
}

// addrDown is how long an address that refused a dial is passed over
// while the peer has others.
const addrDown = time.Second

// downFor is how long a failed address is passed over: addrDown, or, with
// several paths, long enough that lanes do not keep dialling a dead link
// (each such dial holds a slice for PathTimeout) while another path
// serves, and that slices fail at once while every path is down.
func (p *Peer) downFor() time.Duration {
	if p.multipath {
		return max(addrDown, 2*p.c.cfg.PathTimeout)
	}
	return addrDown
}

// pick returns the path a lane dials: the first one from start's home
// (start is the lane's index plus the slice's retries, so lanes spread
// over the home paths) whose last dial did not fail lately, else start's
// home itself.
func (p *Peer) pick(start int) int {
	now := time.Now()
	h := start % p.home
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	for k := range p.paths {
		if i := (h + k) % len(p.paths); !now.Before(p.downUntil[i]) {
			return i
		}
	}
	return h
}

// pathDown marks path i down after a connection on it died (the kernel
// timed it out) and cuts the peer's other connections on it: they share
// the link, and their slices had better move now than wait to find out
// one by one.
func (p *Peer) pathDown(i int, err error) {
	p.dialed(i, err)
	p.connMu.Lock()
	defer p.connMu.Unlock()
	for lc := range p.conns {
		if lc.path == i {
			lc.kill(fmt.Errorf("%w: path %s down: %v", transport.ErrPeer, p.paths[i].name(p), err))
		}
	}
}

// pathDied reports whether err is the kernel giving up on a connection's
// path (TCP_USER_TIMEOUT or keepalives unanswered), as opposed to the
// peer hanging up or a deadline of ours passing.
func pathDied(err error) bool { return errors.Is(err, syscall.ETIMEDOUT) }

// dialed records the outcome of a dial on path i: a failure passes the
// path over for a while (downFor), a success clears that.
func (p *Peer) dialed(i int, err error) {
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	if err != nil {
		p.downUntil[i] = time.Now().Add(p.downFor())
		p.downErr = err
	} else {
		p.downUntil[i] = time.Time{}
	}
}

// allDown returns why, when every path of a multipath peer is down: its
// slices fail at once then, rather than each waiting out dials that
// would time out until its retries or its deadline run out. A peer with
// one path keeps retrying it, as it always did.
func (p *Peer) allDown() error {
	if !p.multipath {
		return nil
	}
	now := time.Now()
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	for _, t := range p.downUntil {
		if !now.Before(t) {
			return nil
		}
	}
	return fmt.Errorf("%w: every path to %s down (last: %v)", transport.ErrPeer, p.key, p.downErr)
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
	paths, home := makePaths(len(addrs), c.cfg.LocalAddrs)
	p := &Peer{c: c, key: key, addrs: addrs, queue: make(chan *transport.Slice, c.cfg.QueueLen), stopc: make(chan struct{}),
		conns: map[*laneConn]struct{}{}, paths: paths, home: home, downUntil: make([]time.Time, len(paths)),
		multipath: len(paths) > 1}
	for i := range c.cfg.Lanes {
		l := &lane{p: p, idx: i}
		p.lanes = append(p.lanes, l)
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

// enqueue admits s, blocking while the queue is full, until s.Deadline or
// the end of ctx.
func (p *Peer) enqueue(ctx context.Context, s *transport.Slice) {
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
	case <-ctx.Done():
		s.Done(s, fmt.Errorf("peer queue full: %w", context.Cause(ctx)))
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
		p.enqueue(context.Background(), s)
	}()
}

// lane owns one connection at a time. Its goroutine writes requests taken
// from the peer's queue; a reader goroutine per connection reads status
// frames and READ payloads in the order the requests went out. A submitter
// that finds the lane idle may write its own requests (SubmitInline) and
// later read the answers itself (Inline.Wait).
type lane struct {
	p   *Peer
	idx int

	// wmu is held by whoever writes on the lane: its goroutine, for as long
	// as it handles what it took from the queue, or a submitter sending its
	// own slices, who only ever tries it. It guards lc, the writer's side of
	// lc, and the scratch below.
	wmu  sync.Mutex
	lc   *laneConn // nil until dialled, after a failed send, once stopped
	hdrs [maxGather][HeaderSize]byte
	sl   []*transport.Slice
	bufs net.Buffers
}

// maxGather bounds the slices one lane sends with a single writev.
const maxGather = 16

// laneConn is one connection of a lane. Requests go out under the lane's
// wmu; answers are read, in wire order, by whoever holds rmu: the reader
// goroutine for slices handed to it through inflight, or the waiter of
// parked slices.
type laneConn struct {
	l        *lane
	conn     net.Conn
	path     int                   // the index of its path in Peer.paths
	inflight chan *transport.Slice // sent to and closed under wmu
	dead     chan struct{}         // closed by kill
	once     sync.Once
	err      error
	retired  chan struct{} // closed by a reader after a refusal
	retire   sync.Once
	wd       deadline // under wmu

	// out counts requests sent whose answers are not settled yet: a lane is
	// idle, and may take inline requests, only at zero.
	out atomic.Int32
	// parked are inline slices whose requests went out while nothing else
	// was unanswered, so their answers are next on the wire. They are taken
	// (swapped to nil) exactly once: by their waiter, by the reader after a
	// Release, or by the writer, which hands them to the reader before
	// anything it sends after them.
	parked atomic.Pointer[[]*transport.Slice]
	kick   chan struct{} // Release: the reader should take parked (or left)

	rmu     sync.Mutex // held while reading answers; guards what follows
	br      *bufio.Reader
	rd      deadline
	st      [StatusSize]byte
	left    []*transport.Slice // answers a waiter whose ctx ended left, in order
	got     uint64             // bytes of the next answer read already
	refused bool               // a request on this connection was refused
}

func (lc *laneConn) kill(err error) {
	lc.once.Do(func() {
		lc.err = err
		close(lc.dead)
		if !errors.Is(err, transport.ErrClosed) || lc.out.Load() > 0 {
			abort(lc.conn)
		}
		lc.conn.Close()
	})
}

// abort makes the next Close of c discard what its socket has not sent
// (SO_LINGER 0: a reset, not a FIN after the data). A connection killed
// with requests unanswered must not deliver the rest of a WRITE later:
// when a cut-off link returns, the kernel would still send the payload of
// a request its slice gave up on, into memory the store may have given to
// another object since (internal/faults TestClientCutOffMidPut).
func abort(c net.Conn) {
	if l, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = l.SetLinger(0)
	}
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

// errInterrupted: a waiter stopped reading an answer because its context
// ended; the reader goroutine reads the rest.
var errInterrupted = errors.New("tcp: wait interrupted")

func (l *lane) run() {
	p := l.p
	defer p.running.Done()
	defer func() {
		l.wmu.Lock()
		defer l.wmu.Unlock()
		if l.lc != nil {
			l.lc.kill(transport.ErrClosed)
			l.drop()
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
		l.wmu.Lock()
		l.serve(s)
		l.wmu.Unlock()
	}
}

// serve sends s, and what else is queued, on the lane's connection. The
// caller holds wmu.
func (l *lane) serve(s *transport.Slice) {
	p := l.p
	if l.lc != nil && !l.lc.usable() {
		l.drop() // its reader settles what is left, then closes it
	}
	if l.lc == nil {
		if err := p.allDown(); err != nil {
			s.Done(s, err)
			return
		}
		lc, err := l.dial(s)
		if err != nil {
			p.fail(s, err)
			return
		}
		l.lc = lc
	}
	lc := l.lc
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
	lc.out.Add(int32(len(l.sl)))
	err := l.send(lc, l.sl)
	if err != nil && p.c.cfg.V1 {
		// v1 acknowledges nothing: what did not go out is lost.
		err = fmt.Errorf("%w: %v", transport.ErrPeer, err)
		lc.kill(err)
		l.drop()
		for _, s := range l.sl {
			p.fail(s, err)
		}
		return
	}
	// Even when the send failed, the peer may have answered part of it
	// (Mooncake's server refuses a WRITE and hangs up without reading
	// its payload): the reader settles each slice from what arrived.
	l.handOff(lc, l.sl)
	if err != nil && p.multipath && pathDied(err) {
		p.pathDown(lc.path, err) // the reader finds it dead and retries the slices
	}
	if err != nil {
		// What went out may end inside a request (a local EFAULT, a
		// write deadline): the peer would wait for its rest, and the
		// reader for its answer, until the deadline. Half-close: the
		// peer answers what it read whole and hangs up on the rest.
		if cw, ok := lc.conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		l.drop()
	}
}

// handOff gives sent slices to the connection's reader, after the parked
// ones if there are any: their requests went out first. The caller holds
// wmu.
func (l *lane) handOff(lc *laneConn, sl []*transport.Slice) {
	if ps := lc.parked.Swap(nil); ps != nil {
		for _, s := range *ps {
			l.give(lc, s)
		}
	}
	for _, s := range sl {
		l.give(lc, s)
	}
}

func (l *lane) give(lc *laneConn, s *transport.Slice) {
	select {
	case lc.inflight <- s:
	case <-lc.dead:
		lc.out.Add(-1)
		l.p.fail(s, lc.err)
	}
}

// drop retires the lane's connection: its reader settles what was sent,
// then closes it. The caller holds wmu.
func (l *lane) drop() {
	l.handOff(l.lc, nil)
	close(l.lc.inflight)
	l.lc = nil
}

func (l *lane) dial(s *transport.Slice) (*laneConn, error) {
	p := l.p
	i := p.pick(l.idx + s.Retries)
	pt := p.paths[i]
	addr := p.addrs[pt.addr]
	limit := p.c.cfg.DialTimeout // what the path gets to answer a dial
	var d net.Dialer
	if pt.local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(pt.local)}
	}
	if p.multipath {
		limit = min(limit, p.c.cfg.PathTimeout)
		d.KeepAliveConfig, d.Control = p.c.pathWatch()
	}
	d.Timeout = min(limit, time.Until(s.Deadline))
	nc, err := d.Dial("tcp", addr)
	// A dial cut short by the slice's own deadline says nothing about the
	// path: marking it down would fail other slices at once (allDown).
	var ne net.Error
	if err == nil || d.Timeout >= limit || !errors.As(err, &ne) || !ne.Timeout() {
		p.dialed(i, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %v", transport.ErrPeer, pt.name(p), err)
	}
	nc.(*net.TCPConn).SetNoDelay(true)
	if err := conn.ClientAuth(nc, p.c.cfg.Secret); err != nil {
		nc.Close()
		// An authentication failure will not heal by retrying.
		return nil, fmt.Errorf("%w: %s: %w", transport.ErrRejected, addr, err)
	}
	lc := &laneConn{l: l, conn: nc, path: i, br: bufio.NewReaderSize(nc, 4096),
		inflight: make(chan *transport.Slice, p.c.cfg.Depth), dead: make(chan struct{}), retired: make(chan struct{}),
		kick: make(chan struct{}, 1), wd: deadline{set: nc.SetWriteDeadline}, rd: deadline{set: nc.SetReadDeadline}}
	if !p.track(lc) {
		nc.Close()
		return nil, transport.ErrClosed
	}
	p.running.Add(1)
	go lc.read()
	return lc, nil
}

// pathWatch returns the keepalive settings and socket option that make the
// kernel fail a connection whose path died within about PathTimeout
// (internal/pathwatch).
func (c *Client) pathWatch() (net.KeepAliveConfig, func(network, address string, rc syscall.RawConn) error) {
	return pathwatch.Dialer(c.cfg.PathTimeout)
}

func (l *lane) send(lc *laneConn, sl []*transport.Slice) error {
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
			b := transport.Bytes(s.Local, s.Length)
			if s.Checksum && !s.Summed {
				// Summed here, the bytes are in the cache the
				// kernel's copy reads them from.
				s.CRC, s.Summed = crc32c.Checksum(b), true
			}
			l.bufs = append(l.bufs, b)
		}
		if s.Deadline.Before(deadline) {
			deadline = s.Deadline
		}
	}
	lc.wd.arm(deadline)
	bufs := l.bufs // WriteTo consumes its receiver
	for {
		_, err := bufs.WriteTo(lc.conn)
		if err == nil || !lc.wd.resume(err, deadline) {
			return err
		}
	}
}

// inline sends sl from the calling goroutine if the lane is free and its
// connection idle, and parks them there for the caller to read their
// answers. It reports whether it took sl; in is nil when they went to the
// reader after all (the send failed).
func (l *lane) inline(sl []*transport.Slice) (in *Inline, taken bool) {
	if !l.wmu.TryLock() {
		return nil, false
	}
	defer l.wmu.Unlock()
	lc := l.lc
	if lc == nil || !lc.usable() || lc.out.Load() != 0 {
		return nil, false
	}
	lc.out.Add(int32(len(sl)))
	if err := l.send(lc, sl); err != nil {
		l.handOff(lc, sl)
		l.drop()
		return nil, true
	}
	in = &Inline{lc: lc, sl: sl}
	lc.parked.Store(&in.sl)
	return in, true
}

// Inline is slices sent by SubmitInline from their submitter's goroutine,
// whose answers are left for that goroutine to read: a submitter that
// waits right away (Engine.Wait) moves the bytes with no goroutine hand-off
// at all. Until Wait or Release, nothing reads the answers unless more
// requests follow them on the same connection.
type Inline struct {
	lc *laneConn
	sl []*transport.Slice
}

// Wait reads the answers in the calling goroutine, unless a reader already
// took them, and returns once every slice's Done was called or the reader
// took over. When ctx ends it stops reading and leaves the rest to the
// reader.
func (in *Inline) Wait(ctx context.Context) {
	lc := in.lc
	lc.rmu.Lock()
	defer lc.rmu.Unlock()
	if !lc.parked.CompareAndSwap(&in.sl, nil) {
		return
	}
	if ctx.Done() == nil {
		for _, s := range in.sl {
			lc.settle(context.Background(), s)
		}
		return
	}
	// An ended ctx cuts the read short through a deadline in the past;
	// whatever it interrupted, the deadline is re-armed before the next
	// read (the callback has returned once stop or fired says so).
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		lc.conn.SetReadDeadline(aLongTimeAgo)
	})
	for i, s := range in.sl {
		if lc.settle(ctx, s) {
			lc.left = in.sl[i:]
			break
		}
	}
	if !stop() {
		<-fired
		lc.rd.at = aLongTimeAgo
	}
	if lc.left != nil {
		in.Release()
	}
}

// Release leaves the slice's answer to the connection's reader goroutine,
// without waiting: for a submitter that polls rather than waits.
func (in *Inline) Release() {
	select {
	case in.lc.kick <- struct{}{}:
	default: // a kick is pending already
	}
}

// aLongTimeAgo is a deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)

// read settles, in wire order, the slices handed over through inflight,
// and parked ones on Release, until the writer closes inflight; then it
// closes the connection. Once the connection died the remaining slices are
// failed for retry without touching the socket.
func (lc *laneConn) read() {
	p := lc.l.p
	defer p.running.Done()
	defer p.untrack(lc)
	defer lc.kill(transport.ErrClosed)
	for {
		select {
		case s, ok := <-lc.inflight:
			lc.rmu.Lock()
			lc.finish() // an interrupted waiter's answer came first
			if ok {
				lc.settle(context.Background(), s)
			}
			lc.rmu.Unlock()
			if !ok {
				return
			}
		case <-lc.kick:
			lc.rmu.Lock()
			lc.finish()
			if ps := lc.parked.Swap(nil); ps != nil {
				for _, s := range *ps {
					lc.settle(context.Background(), s)
				}
			}
			lc.rmu.Unlock()
		}
	}
}

// finish settles the answers a waiter left, the first maybe half read. The
// caller holds rmu.
func (lc *laneConn) finish() {
	for _, s := range lc.left {
		lc.settle(context.Background(), s)
	}
	lc.left = nil
}

// settle reads the answer to s and reports it through s.Done, or retries s
// elsewhere. It gives up when ctx ends and reports that it was
// interrupted, got counting what was read of the answer. The caller holds
// rmu.
func (lc *laneConn) settle(ctx context.Context, s *transport.Slice) (interrupted bool) {
	p := lc.l.p
	select {
	case <-lc.dead:
		lc.got = 0
		lc.out.Add(-1)
		p.fail(s, lc.err)
		return false
	default:
	}
	err := lc.recv(ctx, s)
	if err == errInterrupted {
		return true
	}
	lc.got = 0
	lc.out.Add(-1)
	if err == nil {
		s.Done(s, nil)
		return false
	}
	if errors.Is(err, transport.ErrRejected) {
		s.Done(s, err)
		// Our server keeps the stream in step after a refusal; Mooncake's
		// hangs up. Settle what is in flight here, send on a new one.
		lc.refused = true
		lc.retire.Do(func() { close(lc.retired) })
		return false
	}
	select {
	case <-lc.dead:
		// Cut while we read (its path found down by another lane, or
		// the peer stopped): the reason is why it was cut.
		p.fail(s, lc.err)
		return false
	default:
	}
	switch {
	case pathDied(err) && p.multipath:
		// Checked before timedOut, which ETIMEDOUT also satisfies: the
		// path is down, not the slice late; another path may serve it.
		err = fmt.Errorf("%w: path to %s down: %v", transport.ErrPeer, lc.conn.RemoteAddr(), err)
		lc.kill(err)
		p.pathDown(lc.path, err)
		p.fail(s, err)
		return false
	case timedOut(err):
		err = fmt.Errorf("%w: no answer from %s", transport.ErrTimeout, lc.conn.RemoteAddr())
	case errors.Is(err, ErrMalformed):
	case lc.refused:
		err = fmt.Errorf("%w: %w: %v", transport.ErrPeer, errUnanswered, err)
	default:
		err = fmt.Errorf("%w: %v", transport.ErrPeer, err)
	}
	lc.kill(err)
	p.fail(s, err)
	return false
}

// recv reads the answer to s, or its remainder after an interruption,
// before s.Deadline.
func (lc *laneConn) recv(ctx context.Context, s *transport.Slice) error {
	lc.rd.arm(s.Deadline)
	var hdr uint64
	if !lc.l.p.c.cfg.V1 {
		hdr = StatusSize
		if lc.got < hdr {
			if err := lc.readFull(ctx, lc.st[lc.got:], s.Deadline); err != nil {
				return err
			}
			ok, err := ParseStatus(lc.st[:])
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: %s %#x+%d at %s", transport.ErrRejected, s.Op, s.Remote, s.Length, lc.conn.RemoteAddr())
			}
		}
	}
	if s.Op == transport.Read {
		return lc.readFull(ctx, transport.Bytes(s.Local, s.Length)[lc.got-hdr:], s.Deadline)
	}
	return nil // a v1 WRITE has nothing to read back
}

// readFull fills b, counting progress in got. A deadline passing early is
// resumed (see deadline); with ctx ended, reading stops (errInterrupted).
// ctx is checked after each arming of the deadline, which may have replaced
// the past one its end set.
func (lc *laneConn) readFull(ctx context.Context, b []byte, due time.Time) error {
	for {
		if ctx.Err() != nil {
			return errInterrupted
		}
		n, err := io.ReadFull(lc.br, b)
		lc.got += uint64(n)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && timedOut(err) {
			return errInterrupted
		}
		if !lc.rd.resume(err, due) {
			return err
		}
		b = b[n:]
	}
}
