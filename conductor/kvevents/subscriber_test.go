package kvevents

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/conductor/kvevents/kvtest"
)

// recorder is a Handler that keeps what it got.
type recorder struct {
	mu     sync.Mutex
	hashes []uint64 // the first hash of every stored event, in order
	resets []string
	got    chan struct{}
}

func newRecorder() *recorder { return &recorder{got: make(chan struct{}, 1024)} }

func (r *recorder) Apply(b *Batch) {
	r.mu.Lock()
	for _, e := range b.Events {
		r.hashes = append(r.hashes, e.Hashes[0])
	}
	r.mu.Unlock()
	r.got <- struct{}{}
}

func (r *recorder) Reset(reason string) {
	r.mu.Lock()
	r.resets = append(r.resets, reason)
	r.mu.Unlock()
	r.got <- struct{}{}
}

func (r *recorder) state() ([]uint64, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.hashes...), append([]string(nil), r.resets...)
}

// waitFor waits until the recorder holds want hashes.
func (r *recorder) waitFor(t *testing.T, want []uint64) {
	t.Helper()
	require.Eventually(t, func() bool {
		h, _ := r.state()
		return len(h) >= len(want)
	}, 5*time.Second, 5*time.Millisecond)
	h, _ := r.state()
	require.Equal(t, want, h)
}

func stored(h uint64) []byte {
	return mustPack(map[string]any{"event_type": "stored", "seq_hashes": []uint64{h}})
}

func mustPack(ev map[string]any) []byte {
	p, err := msgpackMarshal([]any{1.0, []any{ev}, 0})
	if err != nil {
		panic(err)
	}
	return p
}

func run(t *testing.T, cfg Config, h Handler) *Subscriber {
	t.Helper()
	s, err := New(cfg, h)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return s
}

func TestSubscriberReplaysHistoryThenFollows(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", true)
	p.Publish(stored(10), true) // before anyone subscribed: only replay has it
	p.Publish(stored(11), true)
	r := newRecorder()
	s := run(t, Config{Endpoint: p.Endpoint, Replay: p.Replay}, r)
	r.waitFor(t, []uint64{10, 11})
	p.WaitSubscribed()
	p.Publish(stored(12), true)
	r.waitFor(t, []uint64{10, 11, 12})
	st := s.Stats()
	assert.True(t, st.Connected)
	assert.Equal(t, uint64(3), st.Batches)
	assert.Equal(t, uint64(2), st.Replayed)
	assert.Equal(t, int64(3), st.Next)
	_, resets := r.state()
	assert.Empty(t, resets)
}

func TestSubscriberFillsGapFromReplay(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", true)
	r := newRecorder()
	s := run(t, Config{Endpoint: p.Endpoint, Replay: p.Replay}, r)
	p.WaitSubscribed()
	require.Eventually(t, func() bool { return s.Stats().Connected }, 5*time.Second, 5*time.Millisecond)
	p.Publish(stored(1), true)
	r.waitFor(t, []uint64{1})
	p.Publish(stored(2), false) // lost on the way
	p.Publish(stored(3), false)
	p.Publish(stored(4), true)
	r.waitFor(t, []uint64{1, 2, 3, 4})
	st := s.Stats()
	assert.Equal(t, uint64(1), st.Gaps)
	assert.Equal(t, uint64(0), st.Resets)
}

func TestSubscriberResetsOnGapWithoutReplay(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", false)
	r := newRecorder()
	s := run(t, Config{Endpoint: p.Endpoint}, r)
	p.WaitSubscribed()
	p.Publish(stored(1), true)
	r.waitFor(t, []uint64{1})
	p.Publish(stored(2), false)
	p.Publish(stored(3), true)
	r.waitFor(t, []uint64{1, 3})
	_, resets := r.state()
	require.Len(t, resets, 1)
	assert.Contains(t, resets[0], "lost")
	assert.Equal(t, uint64(1), s.Stats().Gaps)
}

func TestSubscriberResetsWhenPublisherDies(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", false)
	r := newRecorder()
	s := run(t, Config{Endpoint: p.Endpoint, DownAfter: 300 * time.Millisecond, Retry: 20 * time.Millisecond}, r)
	p.WaitSubscribed()
	p.Publish(stored(1), true)
	r.waitFor(t, []uint64{1})
	start := time.Now()
	p.Close() // its connections drop, redials are refused
	require.Eventually(t, func() bool { _, rs := r.state(); return len(rs) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	_, resets := r.state()
	assert.Contains(t, resets[0], "unreachable")
	assert.False(t, s.Stats().Connected)
	assert.Equal(t, int64(-1), s.Stats().Next)
}

func TestSubscriberSeesRestartedPublisher(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", false)
	addr := p.Addr()
	r := newRecorder()
	s := run(t, Config{Endpoint: p.Endpoint, DownAfter: time.Minute, Retry: 20 * time.Millisecond}, r)
	p.WaitSubscribed()
	p.Publish(stored(1), true)
	p.Publish(stored(2), true)
	r.waitFor(t, []uint64{1, 2})
	p.Close()
	require.Eventually(t, func() bool { return !s.Stats().Connected }, 5*time.Second, 5*time.Millisecond)

	q := kvtest.New(t, addr, false) // same address, sequence from 0
	q.WaitSubscribed()
	q.Publish(stored(7), true)
	r.waitFor(t, []uint64{1, 2, 7})
	_, resets := r.state()
	assert.Equal(t, []string{"publisher restarted"}, resets)
}

func TestSubscriberSkipsMalformedBatches(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", false)
	r := newRecorder()
	s := run(t, Config{Endpoint: p.Endpoint}, r)
	p.WaitSubscribed()
	p.Publish([]byte{0x93, 0x01}, true)
	p.Publish(stored(5), true)
	r.waitFor(t, []uint64{5})
	st := s.Stats()
	assert.Equal(t, uint64(1), st.Malformed)
	assert.Equal(t, uint64(0), st.Gaps)
}

func TestSubscriberDropsOversizedMessages(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", false)
	r := newRecorder()
	s := run(t, Config{Endpoint: p.Endpoint, MaxMessageBytes: 64, Retry: 10 * time.Millisecond}, r)
	p.WaitSubscribed()
	big := mustPack(map[string]any{"event_type": "stored", "seq_hashes": make([]uint64, 40)})
	p.Publish(big, true)
	// The connection is dropped rather than the message buffered; the
	// subscriber reconnects and goes on.
	require.Eventually(t, func() bool { return s.Stats().Subscriptions >= 2 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, uint64(0), s.Stats().Batches)
}

func TestNewRejectsBadEndpoints(t *testing.T) {
	for _, ep := range []string{"", "ipc:///tmp/x", "tcp://host", "tcp://host:0", "tcp://h:1/path"} {
		_, err := New(Config{Endpoint: ep}, newRecorder())
		assert.ErrorIs(t, err, ErrInvalid, ep)
	}
	_, err := New(Config{Endpoint: "tcp://127.0.0.1:1", Replay: "udp://x:1"}, newRecorder())
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = New(Config{Endpoint: "tcp://127.0.0.1:1"}, nil)
	assert.ErrorIs(t, err, ErrInvalid)
	a, err := tcpAddr("tcp://*:5557")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:5557", a)
}

// A peer that is not ZMTP is refused at the handshake, with an error that
// says so.
func TestHandshakeRefusesNonZMTPPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprint(c, "HTTP/1.1 400 Bad Request\r\n\r\n"+string(make([]byte, 64)))
		<-done
	}()
	_, err = dialZMTP(context.Background(), ln.Addr().String(), "SUB", 2*time.Second, 1<<20)
	require.ErrorIs(t, err, errNotZMTP)
}

// Nothing of ours may outlive the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, kvtest.IgnoreLeaks())
}

// A restarted publisher with a replay socket: at the reconnection the
// subscriber does not find its last batch in the new process's history,
// resets and takes that history.
func TestSubscriberSeesRestartedPublisherThroughReplay(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", true)
	addr, rep := p.Addr(), strings.TrimPrefix(p.Replay, "tcp://")
	r := newRecorder()
	s := run(t, Config{Endpoint: p.Endpoint, Replay: p.Replay, DownAfter: time.Minute, Retry: 20 * time.Millisecond}, r)
	p.WaitSubscribed()
	p.Publish(stored(1), true)
	p.Publish(stored(2), true)
	r.waitFor(t, []uint64{1, 2})
	p.Close()
	require.Eventually(t, func() bool { return !s.Stats().Connected }, 5*time.Second, 5*time.Millisecond)

	q := kvtest.Listen(t, addr, rep)
	q.Publish(stored(7), false) // before the subscriber is back: only replay has it
	q.Publish(stored(8), false)
	r.waitFor(t, []uint64{1, 2, 7, 8})
	_, resets := r.state()
	require.Len(t, resets, 1)
	assert.Contains(t, resets[0], "restarted")
	q.WaitSubscribed()
	q.Publish(stored(9), true)
	r.waitFor(t, []uint64{1, 2, 7, 8, 9})
}

// The same publisher after a dropped connection: the subscriber finds its
// last batch in the history and applies only what it missed, no reset.
func TestSubscriberResumesAfterDropWithoutReset(t *testing.T) {
	p := kvtest.New(t, "127.0.0.1:0", true)
	px := newProxy(t, p.Addr())
	r := newRecorder()
	s := run(t, Config{Endpoint: "tcp://" + px.addr(), Replay: p.Replay, Retry: 10 * time.Millisecond}, r)
	p.WaitSubscribed()
	p.Publish(stored(1), true)
	r.waitFor(t, []uint64{1})

	px.pause() // the connection drops; new ones wait
	require.Eventually(t, func() bool { return !s.Stats().Connected }, 5*time.Second, 5*time.Millisecond)
	p.Publish(stored(2), true) // nobody to send it to
	p.Publish(stored(3), true)
	px.resume()
	r.waitFor(t, []uint64{1, 2, 3})
	_, resets := r.state()
	assert.Empty(t, resets)
	assert.Equal(t, uint64(2), s.Stats().Replayed)
}

// proxy forwards TCP connections to a target, and can cut them.
type proxy struct {
	t      *testing.T
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	paused bool
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	px := &proxy{t: t, ln: ln, target: target}
	done := make(chan struct{})
	go px.serve(done)
	t.Cleanup(func() {
		ln.Close()
		px.pause()
		<-done
	})
	return px
}

func (px *proxy) addr() string { return px.ln.Addr().String() }

func (px *proxy) serve(done chan struct{}) {
	defer close(done)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := px.ln.Accept()
		if err != nil {
			return
		}
		px.mu.Lock()
		if px.paused {
			px.mu.Unlock()
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", px.target)
		if err != nil {
			px.mu.Unlock()
			c.Close()
			continue
		}
		px.conns = append(px.conns, c, u)
		px.mu.Unlock()
		wg.Add(2)
		go func() { defer wg.Done(); io.Copy(u, c); u.Close() }()
		go func() { defer wg.Done(); io.Copy(c, u); c.Close() }()
	}
}

// pause closes every connection and refuses new ones until resume.
func (px *proxy) pause() {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.paused = true
	for _, c := range px.conns {
		c.Close()
	}
	px.conns = nil
}

func (px *proxy) resume() {
	px.mu.Lock()
	px.paused = false
	px.mu.Unlock()
}

// A live batch that the connection's replay already applied is a
// duplicate, even batch 0: a publisher cannot restart under one
// connection.
func TestDeliverTellsDuplicatesFromRestarts(t *testing.T) {
	r := newRecorder()
	s, err := New(Config{Endpoint: "tcp://127.0.0.1:1"}, r)
	require.NoError(t, err)
	ctx := context.Background()
	s.apply(0, stored(1), true)
	s.deliver(ctx, 0, stored(1), false)
	h, resets := r.state()
	assert.Equal(t, []uint64{1}, h)
	assert.Empty(t, resets)
	s.deliver(ctx, 0, stored(5), true) // the first batch of a new connection, without replay
	h, resets = r.state()
	assert.Equal(t, []uint64{1, 5}, h)
	assert.Equal(t, []string{"publisher restarted"}, resets)
}
