package kvevents

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Handler receives one publisher's events. A Subscriber calls it from one
// goroutine, batches in sequence order, each once.
type Handler interface {
	// Apply applies a batch.
	Apply(b *Batch)
	// Reset says that what was applied so far no longer describes the
	// publisher's cache: it restarted, it has been unreachable for
	// Config.DownAfter, or events were lost and could not be replayed.
	// The handler drops everything it learnt from this publisher; the
	// batches that follow start afresh.
	Reset(reason string)
}

// Config configures a Subscriber.
type Config struct {
	// Endpoint is the publisher's PUB socket, tcp://host:port (a
	// wildcard host, the publisher's bind form, means this host).
	Endpoint string
	// Replay is its ROUTER socket for missed batches; empty if it has
	// none, in which case a gap resets the handler.
	Replay string
	// Topic is the subscription prefix; empty for every topic.
	Topic string
	// DownAfter is how long the publisher may stay unreachable before the
	// handler is reset. Zero means DefaultDownAfter.
	DownAfter time.Duration
	// Retry is the pause between two connection attempts. Zero means
	// DefaultRetry.
	Retry time.Duration
	// Timeout bounds a connection's handshake and a whole replay. Zero
	// means DefaultTimeout.
	Timeout time.Duration
	// MaxMessageBytes bounds one message. Zero means DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Logger logs connection changes, gaps and malformed batches. Nil
	// means slog.Default().
	Logger *slog.Logger
}

// Defaults for the zero values of Config.
const (
	DefaultDownAfter       = 3 * time.Second
	DefaultRetry           = 200 * time.Millisecond
	DefaultTimeout         = 5 * time.Second
	DefaultMaxMessageBytes = 64 << 20
)

// Stats counts what a Subscriber saw.
type Stats struct {
	// Connected says whether the subscription is up now; Subscriptions
	// counts the connections made.
	Connected     bool
	Subscriptions uint64
	// Batches were applied, Replayed of them fetched from the replay
	// socket; Malformed ones were skipped (counted, logged).
	Batches, Replayed, Malformed uint64
	// Gaps are the holes in the sequence seen; Resets the times the
	// handler was reset.
	Gaps, Resets uint64
	// Next is the next sequence number expected (-1 before the first).
	Next int64
	// LastApplied is when the last batch was applied (zero if never).
	LastApplied time.Time
}

// Subscriber follows one publisher: it subscribes, reconnects when the
// connection drops, replays what it missed, and hands the batches in
// order to its Handler.
type Subscriber struct {
	cfg  Config
	addr string
	rep  string // replay host:port, or ""
	h    Handler
	log  *slog.Logger

	next atomic.Int64 // next sequence number expected; -1: none yet
	last uint64       // fingerprint of the last batch applied (Run's goroutine only)
	mu   sync.Mutex
	st   Stats
}

// ErrInvalid is wrapped by the errors of New: a nil Handler, or an
// endpoint that is not tcp://host:port.
var ErrInvalid = errors.New("kvevents: invalid config")

// New checks cfg and returns a Subscriber that delivers to h once Run.
func New(cfg Config, h Handler) (*Subscriber, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: nil Handler", ErrInvalid)
	}
	addr, err := tcpAddr(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	s := &Subscriber{cfg: cfg, addr: addr, h: h}
	if cfg.Replay != "" {
		if s.rep, err = tcpAddr(cfg.Replay); err != nil {
			return nil, fmt.Errorf("%w: replay: %w", ErrInvalid, err)
		}
	}
	s.cfg.DownAfter = cmp.Or(cfg.DownAfter, DefaultDownAfter)
	s.cfg.Retry = cmp.Or(cfg.Retry, DefaultRetry)
	s.cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	s.cfg.MaxMessageBytes = cmp.Or(cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	s.log = cmp.Or(cfg.Logger, slog.Default()).With("kv_events", cfg.Endpoint)
	s.next.Store(-1)
	s.st.Next = -1
	return s, nil
}

// Stats returns the counters as of now.
func (s *Subscriber) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Next = s.next.Load()
	return st
}

func (s *Subscriber) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.st)
	s.mu.Unlock()
}

// Run follows the publisher until ctx ends, and returns ctx's error.
func (s *Subscriber) Run(ctx context.Context) error {
	var downSince time.Time // zero while up, or before a first failure
	reset := true           // nothing learnt since the last reset
	for ctx.Err() == nil {
		z, err := dialZMTP(ctx, s.addr, "SUB", s.cfg.Timeout, s.cfg.MaxMessageBytes)
		if err == nil {
			err = z.send(append([]byte{1}, s.cfg.Topic...)) // ZMTP 3.0 subscribe
		}
		if err != nil {
			if z != nil {
				z.Close()
			}
			if downSince.IsZero() {
				downSince = time.Now()
				s.log.Info("kv events: cannot subscribe", "err", err)
			}
			if !reset && time.Since(downSince) >= s.cfg.DownAfter {
				s.reset(fmt.Sprintf("publisher unreachable for %v: %v", s.cfg.DownAfter, err))
				s.next.Store(-1) // whatever it publishes next starts afresh
				reset = true
			}
			sleep(ctx, s.cfg.Retry)
			continue
		}
		downSince = time.Time{}
		s.count(func(st *Stats) { st.Connected = true; st.Subscriptions++ })
		s.log.Debug("kv events: subscribed")
		fresh := true // no live batch seen on this connection yet
		if s.rep != "" {
			s.resync(ctx)
			fresh = false
		}
		err = s.follow(ctx, z, fresh)
		z.Close()
		s.count(func(st *Stats) { st.Connected = false })
		reset = s.next.Load() < 0
		if ctx.Err() == nil {
			s.log.Info("kv events: connection lost", "err", err)
			downSince = time.Now()
		}
	}
	return ctx.Err()
}

// follow reads the subscription until it fails or ctx ends. fresh says
// that nothing has checked yet whether the publisher is the one applied
// so far (no replay socket).
func (s *Subscriber) follow(ctx context.Context, z *zconn, fresh bool) error {
	stop := context.AfterFunc(ctx, func() { z.Close() })
	defer stop()
	for {
		msg, err := z.recv()
		if err != nil {
			return err
		}
		seq, payload, ok := message(msg)
		if !ok {
			s.malformed(-1, fmt.Errorf("a message of %d frames", len(msg)))
			continue
		}
		s.deliver(ctx, seq, payload, fresh)
		fresh = false
	}
}

// message splits [topic, seq (8 bytes, big-endian), payload].
func message(msg [][]byte) (seq int64, payload []byte, ok bool) {
	if len(msg) != 3 || len(msg[1]) != 8 {
		return 0, nil, false
	}
	return int64(binary.BigEndian.Uint64(msg[1])), msg[2], true
}

// deliver applies a live batch in sequence order.
func (s *Subscriber) deliver(ctx context.Context, seq int64, payload []byte, fresh bool) {
	next := s.next.Load()
	switch {
	case next < 0 || seq == next:
	case seq > next:
		s.count(func(st *Stats) { st.Gaps++ })
		s.log.Info("kv events: gap", "want", next, "got", seq)
		if s.rep != "" {
			s.fill(ctx, next, seq)
		}
		if s.next.Load() < seq {
			s.reset(fmt.Sprintf("batches %d..%d lost", s.next.Load(), seq-1))
		}
	case fresh && seq == 0:
		// The first batch of a new connection starts the sequence again:
		// the publisher restarted (without a replay socket, nothing
		// better tells).
		s.reset("publisher restarted")
	default:
		return // replay applied it already: a publisher cannot restart under one connection
	}
	s.apply(seq, payload, false)
}

// batch is one message fetched from the replay socket.
type batch struct {
	seq     int64
	payload []byte
}

// fetch asks the replay socket for every buffered batch from start on.
func (s *Subscriber) fetch(ctx context.Context, start int64) ([]batch, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	z, err := dialZMTP(ctx, s.rep, "DEALER", s.cfg.Timeout, s.cfg.MaxMessageBytes)
	if err != nil {
		return nil, err
	}
	defer z.Close()
	stop := context.AfterFunc(ctx, func() { z.Close() })
	defer stop()
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], uint64(start))
	if err := z.send(nil, req[:]); err != nil {
		return nil, err
	}
	var out []batch
	for {
		msg, err := z.recv()
		if err != nil {
			return nil, err
		}
		// [empty, topic, seq, payload]; the end is a seq of -1.
		if len(msg) != 4 || len(msg[0]) != 0 {
			return nil, fmt.Errorf("a replay message of %d frames", len(msg))
		}
		seq, payload, ok := message(msg[1:])
		if !ok {
			return nil, errors.New("a replay message without an 8-byte sequence")
		}
		if seq < 0 {
			return out, nil
		}
		if len(out) > 0 && seq <= out[len(out)-1].seq {
			return nil, fmt.Errorf("replay out of order: %d after %d", seq, out[len(out)-1].seq)
		}
		out = append(out, batch{seq, payload})
	}
}

// resync brings the handler up to date with the replay socket's history
// at a (re)connection. If the publisher still has the last batch applied,
// byte for byte, it is the same process and the batches after it are
// applied; otherwise (it restarted, or what was missed is gone from its
// buffer) the handler is reset and fed the whole history.
func (s *Subscriber) resync(ctx context.Context) {
	history, err := s.fetch(ctx, 0)
	if err != nil {
		s.log.Info("kv events: replay unavailable", "err", err)
		return
	}
	next := s.next.Load()
	if next > 0 {
		same := false
		for _, b := range history {
			if b.seq == next-1 {
				same = fingerprint(b.payload) == s.last
				break
			}
		}
		if !same {
			s.reset("publisher restarted, or its replay buffer no longer has what was missed")
			s.next.Store(-1)
		}
	}
	for _, b := range history {
		if n := s.next.Load(); n >= 0 && b.seq < n {
			continue
		} else if n >= 0 && b.seq > n {
			s.reset(fmt.Sprintf("batches %d..%d lost (replay has %d on)", n, b.seq-1, b.seq))
		}
		s.apply(b.seq, b.payload, true)
	}
}

// fill applies the batches start..until-1 from the replay socket.
func (s *Subscriber) fill(ctx context.Context, start, until int64) {
	missed, err := s.fetch(ctx, start)
	if err != nil {
		s.log.Info("kv events: replay unavailable", "err", err)
		return
	}
	for _, b := range missed {
		if b.seq >= until || b.seq != s.next.Load() {
			return // the live stream has the rest; a hole is the caller's to reset
		}
		s.apply(b.seq, b.payload, true)
	}
}

// fingerprint identifies a payload, to recognise the publisher's last
// batch in its replay buffer.
func fingerprint(p []byte) uint64 {
	h := fnv.New64a()
	h.Write(p)
	return h.Sum64() ^ uint64(len(p))
}

func (s *Subscriber) apply(seq int64, payload []byte, replayed bool) {
	s.next.Store(seq + 1)
	s.last = fingerprint(payload)
	b, err := Decode(payload)
	if err != nil {
		s.malformed(seq, err)
		return
	}
	s.h.Apply(&b)
	s.count(func(st *Stats) {
		st.Batches++
		if replayed {
			st.Replayed++
		}
		st.LastApplied = time.Now()
	})
}

func (s *Subscriber) reset(reason string) {
	s.log.Info("kv events: reset", "reason", reason)
	s.h.Reset(reason)
	s.count(func(st *Stats) { st.Resets++ })
}

func (s *Subscriber) malformed(seq int64, err error) {
	s.log.Warn("kv events: malformed batch skipped", "seq", seq, "err", err)
	s.count(func(st *Stats) { st.Malformed++ })
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
