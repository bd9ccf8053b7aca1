// Package transporttest is an in-memory data path for tests of the engine.
//
// Every slice submitted to a Fake is held until the test settles it, so a
// test decides the order and the outcome of completions: out of order, a
// refusal after a connection error, a deadline passed on one slice of
// many, answers still missing when the engine closes. No socket produces
// those orders on demand. The peer's memory is taken to be in this process
// (a second engine of the same test), so Move can do what a real path does.
package transporttest

import (
	"context"
	"fmt"
	"sync"

	"github.com/mooncake-go/mooncake/engine/transport"
)

// Fake is a transport.Transport whose peers hold slices for the test. Set
// its fields before handing it to an engine.
type Fake struct {
	// Accept decides which peers it opens (the others are
	// transport.ErrUnavailable); nil opens every peer.
	Accept func(transport.PeerInfo) bool
	// OpenErr, when set, fails every Open with it.
	OpenErr error
	// Inline makes its peers take inline submissions (transport.Inliner).
	Inline bool

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced when held or counts change
	held     []*transport.Slice
	owner    map[*transport.Slice]*peer // the peer each held slice came by
	opened   []transport.PeerInfo
	closed   bool
	waited   int // Inline.Wait calls
	released int // Inline.Release calls
}

var (
	_ transport.Transport = (*Fake)(nil)
	_ transport.Peer      = (*peer)(nil)
	_ transport.Inliner   = (*inliner)(nil)
)

// Name implements transport.Transport.
func (f *Fake) Name() string { return "fake" }

// Open implements transport.Transport.
func (f *Fake) Open(_ context.Context, info transport.PeerInfo) (transport.Peer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		return nil, transport.ErrClosed
	case f.OpenErr != nil:
		return nil, f.OpenErr
	case f.Accept != nil && !f.Accept(info):
		return nil, fmt.Errorf("%w: fake declines %s", transport.ErrUnavailable, info.Name)
	}
	f.opened = append(f.opened, info)
	p := &peer{f: f, name: info.Name}
	if f.Inline {
		return &inliner{p}, nil
	}
	return p, nil
}

// Close implements transport.Transport: held slices fail with
// transport.ErrClosed, and so does every later submission.
func (f *Fake) Close() error {
	f.mu.Lock()
	f.closed = true
	held := f.held
	f.held, f.owner = nil, nil
	f.signal()
	f.mu.Unlock()
	for _, s := range held {
		s.Done(s, transport.ErrClosed)
	}
	return nil
}

// drop fails the slices held for p, as a closed peer does.
func (f *Fake) drop(p *peer) {
	f.mu.Lock()
	var gone []*transport.Slice
	kept := f.held[:0]
	for _, s := range f.held {
		if f.owner[s] == p {
			gone = append(gone, s)
			delete(f.owner, s)
		} else {
			kept = append(kept, s)
		}
	}
	clear(f.held[len(kept):])
	f.held = kept
	f.signal()
	f.mu.Unlock()
	for _, s := range gone {
		s.Done(s, fmt.Errorf("%w: fake peer %s closed", transport.ErrClosed, p.name))
	}
}

// Opened returns what the engine told the fake of each peer it opened.
func (f *Fake) Opened() []transport.PeerInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]transport.PeerInfo(nil), f.opened...)
}

// Take waits until at least n slices are held and returns the first n, in
// submission order. They are the caller's from then on: it settles each
// exactly once (Move, Fail, or a submission to another path).
func (f *Fake) Take(ctx context.Context, n int) ([]*transport.Slice, error) {
	for {
		f.mu.Lock()
		if len(f.held) >= n {
			sl := append([]*transport.Slice(nil), f.held[:n]...)
			f.held = f.held[n:]
			for _, s := range sl {
				delete(f.owner, s)
			}
			f.signal()
			f.mu.Unlock()
			return sl, nil
		}
		ch := f.watch()
		have := len(f.held)
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("transporttest: %d slices held, %d wanted: %w", have, n, ctx.Err())
		}
	}
}

// Inlined reports how many inline groups were waited for by their
// submitter and how many were released to the transport.
func (f *Fake) Inlined() (waited, released int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waited, f.released
}

// Move copies s's bytes between its local and remote addresses, both in
// this process, and reports success: what a working path does.
func Move(s *transport.Slice) {
	local, remote := transport.Bytes(s.Local, s.Length), transport.Bytes(uintptr(s.Remote), s.Length)
	if s.Op == transport.Write {
		copy(remote, local)
	} else {
		copy(local, remote)
	}
	s.Done(s, nil)
}

// Fail reports s failed with err, which the engine sorts by errors.Is
// (transport.ErrRejected, ErrTimeout, ErrPeer, ErrClosed).
func Fail(s *transport.Slice, err error) { s.Done(s, err) }

// watch returns a channel closed at the next change. The caller holds mu.
func (f *Fake) watch() chan struct{} {
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return f.changed
}

// signal wakes the watchers. The caller holds mu.
func (f *Fake) signal() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// hold keeps s, which came by p, for the test, or fails it once the fake
// or p is closed.
func (f *Fake) hold(p *peer, s *transport.Slice) {
	f.mu.Lock()
	if f.closed || p.closed {
		f.mu.Unlock()
		s.Done(s, transport.ErrClosed)
		return
	}
	if f.owner == nil {
		f.owner = map[*transport.Slice]*peer{}
	}
	f.owner[s] = p
	f.held = append(f.held, s)
	f.signal()
	f.mu.Unlock()
}

// peer is an opened fake peer.
type peer struct {
	f      *Fake
	name   string
	closed bool // guarded by f.mu
}

// Submit implements transport.Peer: s waits for the test.
func (p *peer) Submit(_ context.Context, s *transport.Slice) { p.f.hold(p, s) }

// Path implements transport.Peer.
func (p *peer) Path() string { return "fake" }

// Close implements transport.Peer: the slices it holds for this peer (not
// those the test took) fail with transport.ErrClosed, and so do later
// submissions.
func (p *peer) Close() {
	p.f.mu.Lock()
	p.closed = true
	p.f.mu.Unlock()
	p.f.drop(p)
}

// inliner is a fake peer that also takes inline submissions.
type inliner struct{ *peer }

// SubmitInline implements transport.Inliner: the slices are held as by
// Submit, and the returned Inline counts how the engine disposes of it.
func (p *inliner) SubmitInline(_ context.Context, sl []*transport.Slice) transport.Inline {
	for _, s := range sl {
		p.f.hold(p.peer, s)
	}
	return &inline{f: p.f}
}

type inline struct {
	f    *Fake
	once sync.Once
}

// Wait implements transport.Inline. The engine's Wait calls it before
// waiting for the batch, so the count is the proof that the engine read
// the answers in the submitter's goroutine.
func (in *inline) Wait(context.Context) {
	in.once.Do(func() {
		in.f.mu.Lock()
		in.f.waited++
		in.f.signal()
		in.f.mu.Unlock()
	})
}

// Release implements transport.Inline.
func (in *inline) Release() {
	in.once.Do(func() {
		in.f.mu.Lock()
		in.f.released++
		in.f.signal()
		in.f.mu.Unlock()
	})
}
