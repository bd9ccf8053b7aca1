package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine/transport"
)

// relay listens on addr and forwards every connection to target, noting
// the address each came from: which local address a lane dialled from.
// With a gate, it forwards nothing until the gate opens.
type relay struct {
	ln      net.Listener
	gate    *gate
	mu      sync.Mutex
	sources []string
	conns   []net.Conn
	wg      sync.WaitGroup
}

// gate opens once want connections arrived, at any of the relays sharing
// it: answers held until every lane connected force each lane to connect.
type gate struct {
	mu   sync.Mutex
	want int
	open chan struct{}
}

func newGate(want int) *gate { return &gate{want: want, open: make(chan struct{})} }

func (g *gate) arrive() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.want--; g.want == 0 {
		close(g.open)
	}
}

func startRelay(t *testing.T, addr, target string, g *gate) *relay {
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	r := &relay{ln: ln, gate: g}
	r.wg.Add(1)
	go r.accept(target)
	t.Cleanup(r.close)
	return r
}

func (r *relay) accept(target string) {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.sources = append(r.sources, c.RemoteAddr().(*net.TCPAddr).IP.String())
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		if r.gate != nil {
			r.gate.arrive()
		}
		r.wg.Add(2)
		go r.pipe(c, up)
		go r.pipe(up, c)
	}
}

func (r *relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	if r.gate != nil {
		select {
		case <-r.gate.open:
		case <-time.After(10 * time.Second): // the test fails on the sources
		}
	}
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

func (r *relay) close() {
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// from is the set of addresses connections came from, sorted.
func (r *relay) from() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := slices.Clone(r.sources)
	slices.Sort(s)
	return slices.Compact(s)
}

// TestLocalAddrsSpread: with several local addresses, lanes dial from
// each: rail-aligned when the peer has as many addresses (local i to peer
// address i), in turn over all of them when it has one. The bytes are
// right either way.
func TestLocalAddrsSpread(t *testing.T) {
	remote := make([]byte, 1<<20)
	for i := range remote {
		remote[i] = byte(i * 13)
	}
	s := startServer(t, &testMem{base: remote})
	run := func(t *testing.T, locals []string, addrs []string) {
		c := NewClient(ClientConfig{Lanes: 4, LocalAddrs: locals})
		t.Cleanup(func() { c.Close() })
		p, err := c.Peer(addrs)
		require.NoError(t, err)
		pr := &pair{c: c, p: p, local: make([]byte, 1<<20), remote: remote}
		// More slices than three lanes can hold unanswered (16 sent
		// and 16 gathered each, and one being read), and no answer
		// before all four connected: every lane takes some.
		var dones []chan error
		for i := range 160 {
			sl, done := pr.slice(transport.Read, i*4096, 4096)
			p.Submit(context.Background(), sl)
			dones = append(dones, done)
		}
		for i, done := range dones {
			require.NoError(t, <-done, "slice %d", i)
		}
		require.True(t, bytes.Equal(served(0, 160*4096), pr.local[:160*4096]), "bytes read")
		require.True(t, p.multipath)
	}
	t.Run("rail-aligned", func(t *testing.T) {
		g := newGate(4)
		a := startRelay(t, "127.0.0.1:0", s.Addr().String(), g)
		b := startRelay(t, "127.0.0.2:0", s.Addr().String(), g)
		run(t, []string{"127.0.0.3", "127.0.0.4"}, []string{a.ln.Addr().String(), b.ln.Addr().String()})
		require.Equal(t, []string{"127.0.0.3"}, a.from())
		require.Equal(t, []string{"127.0.0.4"}, b.from())
	})
	t.Run("one peer address", func(t *testing.T) {
		a := startRelay(t, "127.0.0.1:0", s.Addr().String(), newGate(4))
		run(t, []string{"127.0.0.3", "127.0.0.4"}, []string{a.ln.Addr().String()})
		require.Equal(t, []string{"127.0.0.3", "127.0.0.4"}, a.from())
	})
}

// TestPathWatchOnlyWithPaths: lanes to a peer with several paths arm
// TCP_USER_TIMEOUT at PathTimeout, so the kernel fails a connection whose
// link died; lanes to a peer with a single path keep the kernel's default
// (a slow peer is waited for until the slice deadline, as before).
func TestPathWatchOnlyWithPaths(t *testing.T) {
	remote := make([]byte, 1<<16)
	s := startServer(t, &testMem{base: remote})
	second := startRelay(t, "127.0.0.2:0", s.Addr().String(), nil)
	for _, tc := range []struct {
		name  string
		addrs []string
		want  int // TCP_USER_TIMEOUT, ms
	}{
		{"one path", []string{s.Addr().String()}, 0},
		{"two paths", []string{s.Addr().String(), second.ln.Addr().String()}, 1500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClient(ClientConfig{Lanes: 2, PathTimeout: 1500 * time.Millisecond})
			t.Cleanup(func() { c.Close() })
			p, err := c.Peer(tc.addrs)
			require.NoError(t, err)
			pr := &pair{c: c, p: p, local: make([]byte, 1<<16), remote: remote}
			var dones []chan error
			for i := range 8 {
				sl, done := pr.slice(transport.Read, i*4096, 4096)
				p.Submit(context.Background(), sl)
				dones = append(dones, done)
			}
			for _, done := range dones {
				require.NoError(t, <-done)
			}
			p.connMu.Lock()
			defer p.connMu.Unlock()
			require.NotEmpty(t, p.conns)
			for lc := range p.conns {
				rc, err := lc.conn.(*net.TCPConn).SyscallConn()
				require.NoError(t, err)
				var got int
				var gerr error
				require.NoError(t, rc.Control(func(fd uintptr) {
					got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
				}))
				require.NoError(t, gerr)
				require.Equal(t, tc.want, got, "TCP_USER_TIMEOUT of a lane to %s", lc.conn.RemoteAddr())
			}
		})
	}
}

// TestMakePaths: the home paths come first (rail-aligned when the counts
// match, the fewer side taken in turn otherwise), then every other
// pairing, each once.
func TestMakePaths(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		locals []string
		want   []path
		home   int
	}{
		// No local addresses: one path per peer address, all home.
		{"system picks", 2, nil, []path{{0, ""}, {1, ""}}, 2},
		// Two and two: rails first, then the crossings.
		{"rails", 2, []string{"a", "b"}, []path{{0, "a"}, {1, "b"}, {0, "b"}, {1, "a"}}, 2},
		// One peer address: every local one is a home path.
		{"one peer address", 1, []string{"a", "b"}, []path{{0, "a"}, {0, "b"}}, 2},
		// Three peer addresses, two of ours: ours in turn.
		{"more peer addresses", 3, []string{"a", "b"}, []path{{0, "a"}, {1, "b"}, {2, "a"}, {0, "b"}, {1, "a"}, {2, "b"}}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, home := makePaths(tc.n, tc.locals)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.home, home)
		})
	}
}

// TestPathsDownOneByOne: with two local addresses and one peer address, a
// path found down is passed over for the other; only when both are down
// do slices fail at once, with the reason.
func TestPathsDownOneByOne(t *testing.T) {
	c := NewClient(ClientConfig{Lanes: 1, LocalAddrs: []string{"127.0.0.3", "127.0.0.4"}})
	t.Cleanup(func() { c.Close() })
	p, err := c.Peer([]string{"127.0.0.1:1"})
	require.NoError(t, err)
	dead := errors.New("connection timed out")
	require.Equal(t, []int{0, 1}, []int{p.pick(0), p.pick(1)})
	p.pathDown(0, dead)
	require.NoError(t, p.allDown(), "the peer address is still reached from the other local address")
	require.Equal(t, []int{1, 1}, []int{p.pick(0), p.pick(1)})
	p.pathDown(1, dead)
	require.ErrorIs(t, p.allDown(), transport.ErrPeer)
	require.ErrorContains(t, p.allDown(), "connection timed out")
	p.dialed(0, nil)
	require.NoError(t, p.allDown())
}
