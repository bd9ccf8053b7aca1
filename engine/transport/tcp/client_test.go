package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/nettest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair is a client with one peer, a served window and local memory.
type pair struct {
	c      *Client
	p      *Peer
	local  []byte
	remote []byte
}

func newPair(t *testing.T, cfg ClientConfig) *pair {
	remote := make([]byte, 8<<20)
	for i := range remote {
		remote[i] = byte(i * 13)
	}
	s := startServer(t, &testMem{base: remote})
	c := NewClient(cfg)
	t.Cleanup(func() { c.Close() })
	p, err := c.Peer([]string{s.Addr().String()})
	require.NoError(t, err)
	pr := &pair{c: c, p: p, local: make([]byte, 8<<20), remote: remote}
	t.Cleanup(func() { runtime.KeepAlive(pr) })
	return pr
}

// slice is a request for n bytes at offset off of both windows, whose
// outcome arrives on the returned channel.
func (pr *pair) slice(op transport.Op, off, n int) (*transport.Slice, chan error) {
	return pr.sliceAt(op, off, off, n)
}

func (pr *pair) sliceAt(op transport.Op, local, remote, n int) (*transport.Slice, chan error) {
	done := make(chan error, 1)
	s := &transport.Slice{Op: op, Local: uintptr(unsafe.Pointer(&pr.local[local])),
		Remote: uint64(uintptr(unsafe.Pointer(&pr.remote[remote]))), Length: uint64(n),
		Deadline: time.Now().Add(10 * time.Second), Done: func(_ *transport.Slice, err error) { done <- err }}
	return s, done
}

// served is what the remote window holds at [off, off+n) before any write.
// Tests compare with it rather than with the window itself: the server
// writes there, and the race detector cannot see a TCP answer order that.
func served(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((off + i) * 13)
	}
	return b
}

// warm runs one slice through the queue so that the first lane has a
// connection, which inline sends need.
func (pr *pair) warm(t *testing.T) {
	s, done := pr.slice(transport.Read, 0, 8)
	pr.p.Submit(context.Background(), s)
	require.NoError(t, <-done)
	pr.quiesce()
}

// quiesce returns once no lane goroutine is still busy with what it took
// from the queue: its slices may be settled before it lets go of the lane,
// and an inline send only tries the lane.
func (pr *pair) quiesce() {
	for _, l := range pr.p.lanes {
		l.wmu.Lock()
		//lint:ignore SA2001 waiting for the holder is the point
		l.wmu.Unlock()
	}
}

// inline sends a slice inline and fails the test if it went to the queue.
func (pr *pair) inline(t *testing.T, op transport.Op, off, n int) (transport.Inline, chan error) {
	t.Helper()
	s, done := pr.slice(op, off, n)
	in := pr.p.SubmitInline(context.Background(), []*transport.Slice{s})
	require.NotNil(t, in, "an idle lane takes the slice inline")
	return in, done
}

// TestInline moves slices written by the submitter, their answers read by
// their waiter or, once released, by the lane's reader.
func TestInline(t *testing.T) {
	for _, tc := range []struct {
		name   string
		op     transport.Op
		settle func(in transport.Inline)
	}{
		// The waiter reads the answer itself.
		{"read waited", transport.Read, func(in transport.Inline) { in.Wait(context.Background()) }},
		{"write waited", transport.Write, func(in transport.Inline) { in.Wait(context.Background()) }},
		// A poller releases it to the reader goroutine.
		{"read released", transport.Read, func(in transport.Inline) { in.Release() }},
		// A waiter whose context already ended leaves it to the reader.
		{"read, context ended", transport.Read, func(in transport.Inline) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			in.Wait(ctx)
			in.Release()
		}},
		// A live cancellable context changes nothing.
		{"read, cancellable context", transport.Read, func(in transport.Inline) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			in.Wait(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := newPair(t, ClientConfig{Lanes: 2})
			pr.warm(t)
			if tc.op == transport.Write {
				for i := range pr.local {
					pr.local[i] = byte(i * 7)
				}
			}
			const off, n = 4096, 1<<20 + 3
			in, done := pr.inline(t, tc.op, off, n)
			tc.settle(in)
			require.NoError(t, <-done)
			want := served(off, n)
			if tc.op == transport.Write {
				// Read it back on the same connection, elsewhere.
				want = bytes.Clone(pr.local[off : off+n])
				s, done := pr.sliceAt(transport.Read, 2<<20, off, n)
				in := pr.p.SubmitInline(context.Background(), []*transport.Slice{s})
				require.NotNil(t, in)
				in.Wait(context.Background())
				require.NoError(t, <-done)
				require.True(t, bytes.Equal(want, pr.local[2<<20:2<<20+n]))
				return
			}
			require.True(t, bytes.Equal(want, pr.local[off:off+n]))
		})
	}
}

// TestInlineThenQueued parks an inline slice nobody waits for, then queues
// more on the same lane: the lane hands the parked slice to its reader
// first, so every answer lands with its own slice.
func TestInlineThenQueued(t *testing.T) {
	pr := newPair(t, ClientConfig{Lanes: 1})
	pr.warm(t)
	in, first := pr.inline(t, transport.Read, 0, 64<<10)
	var dones []chan error
	for i := 1; i <= 40; i++ {
		op := transport.Read
		if i%3 == 0 {
			op = transport.Write
		}
		s, done := pr.slice(op, i*64<<10, 64<<10)
		pr.p.Submit(context.Background(), s)
		dones = append(dones, done)
	}
	require.NoError(t, <-first)
	in.Wait(context.Background()) // already settled: returns at once
	for _, d := range dones {
		require.NoError(t, <-d)
	}
	for i := 0; i <= 40; i++ {
		if i%3 != 0 || i == 0 { // reads
			require.True(t, bytes.Equal(served(i*64<<10, 64<<10), pr.local[i*64<<10:(i+1)*64<<10]), "read %d", i)
		}
	}
	// With nothing in flight the lane takes inline slices again.
	pr.quiesce()
	in, done := pr.inline(t, transport.Read, 0, 8)
	in.Wait(context.Background())
	require.NoError(t, <-done)
}

// TestInlineGroup sends a few slices inline together, one of them refused,
// and reads their answers in one goroutine; past the limits of a group they
// are queued.
func TestInlineGroup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n, len int
		inline bool
	}{
		// Four 256 KiB slices go together.
		{"small group", 4, 256 << 10, true},
		// More than one writev gathers.
		{"many slices", maxGather + 1, 4 << 10, false},
		// More than maxInlineBytes.
		{"many bytes", 5, 1 << 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := newPair(t, ClientConfig{Lanes: 2})
			pr.warm(t)
			const refused = 1
			var sl []*transport.Slice
			var dones []chan error
			for i := range tc.n {
				op := transport.Read
				if i%2 == 1 {
					op = transport.Write
				}
				s, done := pr.slice(op, i*tc.len, tc.len)
				if i == refused {
					s.Remote = 8
				}
				sl = append(sl, s)
				dones = append(dones, done)
			}
			in := pr.p.SubmitInline(context.Background(), sl)
			require.Equal(t, tc.inline, in != nil)
			if in != nil {
				in.Wait(context.Background())
			}
			for i, d := range dones {
				err := <-d
				switch {
				case i == refused:
					require.ErrorIs(t, err, transport.ErrRejected)
				case sl[i].Op == transport.Read:
					require.NoError(t, err)
					require.True(t, bytes.Equal(served(i*tc.len, tc.len), pr.local[i*tc.len:(i+1)*tc.len]), "slice %d", i)
				default:
					require.NoError(t, err)
				}
			}
		})
	}
}

// TestInlineRefused: a refused inline slice fails for good; the client goes
// on with a fresh connection.
func TestInlineRefused(t *testing.T) {
	pr := newPair(t, ClientConfig{Lanes: 1})
	pr.warm(t)
	s, done := pr.slice(transport.Read, 0, 8)
	s.Remote = 8 // not served
	in := pr.p.SubmitInline(context.Background(), []*transport.Slice{s})
	require.NotNil(t, in)
	in.Wait(context.Background())
	require.ErrorIs(t, <-done, transport.ErrRejected)
	s, done = pr.slice(transport.Read, 0, 8)
	pr.p.Submit(context.Background(), s)
	require.NoError(t, <-done)
}

// TestInlineCloseFailsParked: closing the client settles a parked slice that
// nobody waits for.
func TestInlineCloseFailsParked(t *testing.T) {
	pr := newPair(t, ClientConfig{Lanes: 1})
	pr.warm(t)
	_, done := pr.inline(t, transport.Read, 0, 1<<20)
	require.NoError(t, pr.c.Close())
	require.ErrorIs(t, <-done, transport.ErrClosed)
}

// TestInlineWaitInterrupted: a waiter whose context ends while the answer
// is half read returns; the reader goroutine reads the rest into place.
func TestInlineWaitInterrupted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	const n = 1 << 20
	payload := bytes.Repeat([]byte("mooncake"), n/8)
	half, rest := make(chan struct{}), make(chan struct{})
	served := make(chan error, 1)
	go func() {
		// A server that answers the first READ at once and the second in
		// two halves, the second on the test's word.
		served <- func() error {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			defer c.Close()
			var h [HeaderSize]byte
			for i := range 2 {
				if _, err := io.ReadFull(c, h[:]); err != nil {
					return err
				}
				hd, _ := ParseHeader(h[:])
				ans := append(status(StatusOK), payload[:hd.Size]...)
				if i == 1 {
					if _, err := c.Write(ans[:len(ans)/2]); err != nil {
						return err
					}
					close(half)
					<-rest
					ans = ans[len(ans)/2:]
				}
				if _, err := c.Write(ans); err != nil {
					return err
				}
			}
			_, err = io.Copy(io.Discard, c) // until the client closes
			return err
		}()
	}()
	c := NewClient(ClientConfig{Lanes: 1})
	defer c.Close()
	p, err := c.Peer([]string{ln.Addr().String()})
	require.NoError(t, err)
	pr := &pair{c: c, p: p, local: make([]byte, n), remote: make([]byte, n)}
	pr.warm(t)
	in, done := pr.inline(t, transport.Read, 0, n)
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan struct{})
	go func() {
		in.Wait(ctx)
		close(waited)
	}()
	<-half
	cancel()
	<-waited
	select {
	case err := <-done:
		t.Fatalf("settled before the rest of the answer came: %v", err)
	default:
	}
	close(rest)
	require.NoError(t, <-done)
	require.Equal(t, payload, pr.local)
	require.NoError(t, c.Close())
	require.NoError(t, <-served)
}

// TestDeadline checks when a deadline is moved: seldom while requests of
// equal timeouts follow each other, always when one needs it sooner, and a
// timeout is resumed only before the deadline wanted.
func TestDeadline(t *testing.T) {
	var sets []time.Time
	d := deadline{set: func(t time.Time) error { sets = append(sets, t); return nil }}
	now := time.Now()
	d.arm(now.Add(30 * time.Second))
	d.arm(now.Add(30*time.Second + time.Millisecond)) // later: keep the armed one
	require.Len(t, sets, 1)
	d.arm(now.Add(10 * time.Second)) // sooner: move it
	require.Len(t, sets, 2)
	d.arm(now.Add(30 * time.Second)) // armed one lies under halfway: move it
	require.Len(t, sets, 3)

	require.True(t, d.resume(os.ErrDeadlineExceeded, now.Add(time.Minute)))
	require.Equal(t, now.Add(time.Minute), sets[3])
	require.False(t, d.resume(os.ErrDeadlineExceeded, now.Add(-time.Second)), "the deadline wanted has passed")
	require.False(t, d.resume(io.ErrUnexpectedEOF, now.Add(time.Minute)), "not a timeout")
	d.clear()
	require.True(t, sets[len(sets)-1].IsZero())
	d.clear() // nothing armed: nothing to do
	require.Len(t, sets, 5)
}

// TestServerDeadlines: a deadline armed for one request's payload must not
// cut the connection while the peer idles before the next, and still bounds
// a payload that stalls.
func TestServerDeadlines(t *testing.T) {
	win := make([]byte, 4096)
	s, err := Listen("127.0.0.1:0", ServerConfig{Memory: &testMem{base: win}, PayloadTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	defer s.Close()
	base := uint64(uintptr(unsafe.Pointer(&win[0])))
	c, err := net.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var h [HeaderSize]byte
	PutHeader(h[:], Header{Size: 4, Addr: base, Op: opWrite, V2: true})
	_, err = c.Write(append(h[:], 1, 2, 3, 4))
	require.NoError(t, err)
	var st [StatusSize]byte
	_, err = io.ReadFull(c, st[:])
	require.NoError(t, err)
	require.Equal(t, status(StatusOK), st[:])

	time.Sleep(150 * time.Millisecond) // idle past the payload's deadline
	PutHeader(h[:], Header{Size: 4, Addr: base, Op: opRead, V2: true})
	_, err = c.Write(h[:])
	require.NoError(t, err)
	got := make([]byte, StatusSize+4)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err, "the idle connection still serves")
	require.Equal(t, append(status(StatusOK), 1, 2, 3, 4), got)

	// A payload that stops halfway is cut at the deadline.
	PutHeader(h[:], Header{Size: 8, Addr: base, Op: opWrite, V2: true})
	_, err = c.Write(append(h[:], 1, 2))
	require.NoError(t, err)
	start := time.Now()
	_, err = c.Read(st[:])
	require.True(t, errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err), "%v", err)
	require.Less(t, time.Since(start), 3*time.Second)
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// TestSharedPeerOutlivesOneClose: two opens of one peer's addresses share
// its lanes; closing one (a segment opened twice under a race, or two names
// for one engine) leaves the other's working.
func TestSharedPeerOutlivesOneClose(t *testing.T) {
	pr := newPair(t, ClientConfig{Lanes: 2})
	again, err := pr.c.Peer(pr.p.addrs)
	require.NoError(t, err)
	require.Same(t, pr.p, again, "the same addresses share lanes")
	again.Close()
	s, done := pr.slice(transport.Read, 0, 4096)
	pr.p.Submit(context.Background(), s)
	require.NoError(t, <-done, "the other reference still moves bytes")
	require.Equal(t, served(0, 4096), pr.local[:4096])
	pr.p.Close()
	s, done = pr.slice(transport.Read, 0, 4096)
	pr.p.Submit(context.Background(), s)
	require.ErrorIs(t, <-done, transport.ErrClosed, "the last Close stops the lanes")
}

// TestAddressList: a peer published at several addresses is reached
// through a live one when another refuses connections, on every lane; with
// only the dead address, slices fail as a peer error.
func TestAddressList(t *testing.T) {
	dead := nettest.RefusedAddr(t)

	remote := make([]byte, 1<<20)
	for i := range remote {
		remote[i] = byte(i * 13)
	}
	s := startServer(t, &testMem{base: remote})
	// One retry: after a refused dial every lane passes over the dead
	// address, so no slice meets it twice.
	c := NewClient(ClientConfig{Lanes: 4, MaxRetries: 1})
	t.Cleanup(func() { c.Close() })
	p, err := c.Peer([]string{dead, s.Addr().String()})
	require.NoError(t, err)
	pr := &pair{c: c, p: p, local: make([]byte, 1<<20), remote: remote}
	var dones []chan error
	for i := range 16 {
		sl, done := pr.slice(transport.Read, i*(64<<10), 64<<10)
		p.Submit(context.Background(), sl)
		dones = append(dones, done)
	}
	for i, done := range dones {
		require.NoError(t, <-done, "slice %d", i)
	}
	require.Equal(t, served(0, 1<<20), pr.local)

	only, err := c.Peer([]string{dead})
	require.NoError(t, err)
	sl, done := pr.slice(transport.Read, 0, 4096)
	only.Submit(context.Background(), sl)
	require.ErrorIs(t, <-done, transport.ErrPeer)
}

// TestPickPassesOverRefusedAddresses: once a dial to an address failed,
// every lane starts from the next address that did not, for a while; an
// address that answers again is used again.
func TestPickPassesOverRefusedAddresses(t *testing.T) {
	c := NewClient(ClientConfig{Lanes: 1})
	t.Cleanup(func() { c.Close() })
	p, err := c.Peer([]string{"a:1", "b:1", "c:1"})
	require.NoError(t, err)
	refused := errors.New("connection refused")
	require.Equal(t, []int{0, 1, 2}, []int{p.pick(0), p.pick(1), p.pick(2)}, "lanes spread over the addresses")
	p.dialed(0, refused)
	require.Equal(t, []int{1, 1, 2, 1}, []int{p.pick(0), p.pick(1), p.pick(2), p.pick(3)})
	p.dialed(1, refused)
	require.Equal(t, []int{2, 2, 2}, []int{p.pick(0), p.pick(1), p.pick(2)})
	p.dialed(2, refused)
	require.Equal(t, []int{0, 1, 2}, []int{p.pick(0), p.pick(1), p.pick(2)}, "all down: each its own")
	p.dialed(0, nil)
	require.Equal(t, []int{0, 0, 0}, []int{p.pick(0), p.pick(1), p.pick(2)})
}
