package shm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/engine/transport"
)

// A same-host view is the peer's descriptor as of some moment, and peers
// register and unregister memory while it is in use (NIXL's backend test
// registers more after the initiator opened it; so do frameworks growing
// their KV cache). A slice the view cannot serve - outside its regions, or
// taken after the peer's control counter moved - is not failed on the
// view's word: it waits for a refresh of the view from the peer's current
// descriptor and is tried again. Only a range the refreshed view still
// lacks fails, as the peer itself would refuse it.
//
// Refreshes are per segment, one at a time and at most one per minRefresh:
// every slice that misses meanwhile waits for the next one, so a burst of
// misses (or a caller retrying an address the peer never registered) costs
// one descriptor request, not one each. They run on their own goroutine,
// never on a copy worker, so transfers to other peers go on.

// minRefresh spaces the refreshes of one segment's view.
const minRefresh = 20 * time.Millisecond

// viewRefresh is the refresh state of one segment's view.
type viewRefresh struct {
	mu      sync.Mutex
	running bool               // a refresher goroutine owns waiting
	waiting []*transport.Slice // slices that missed since the last refresh began
	last    time.Time          // when the last refresh began
}

// missed takes a slice the same-host view could not serve (the Pool calls
// it on a copy worker, so it must not block): a peer out of reach is left
// to the next path, a stale or short view is refreshed first.
func (p *peer) missed(s *transport.Slice, err error) {
	if errors.Is(err, ErrOnDevice) {
		p.passOn(s, err) // this slice only: the peer stays reachable here
		return
	}
	if errors.Is(err, ErrUnavailable) {
		p.giveUp(s, err)
		return
	}
	r := &p.refresh
	r.mu.Lock()
	r.waiting = append(r.waiting, s)
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start {
		// A copy worker calls this before Close waits on t.wg (Close stops
		// the workers first), so the Add is ordered before the Wait.
		p.t.wg.Add(1)
		go p.refresher()
	}
}

// refresher refreshes p's view until no slice waits for it.
func (p *peer) refresher() {
	defer p.t.wg.Done()
	r := &p.refresh
	for {
		r.mu.Lock()
		wait := time.Until(r.last.Add(minRefresh))
		r.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.t.ctx.Done():
				t.Stop()
			}
		}
		// The slices taken here missed before this refresh began: what it
		// finds is the answer for them.
		r.mu.Lock()
		missed := r.waiting
		r.waiting = nil
		r.last = time.Now()
		r.mu.Unlock()
		err := p.refreshView(missed)
		for _, s := range missed {
			p.retry(s, err, true)
		}
		// Slices that missed while it ran may have missed the old view:
		// the new one serves those it covers; the rest wait for the next.
		r.mu.Lock()
		more := r.waiting
		r.waiting = nil
		r.mu.Unlock()
		for _, s := range more {
			p.retry(s, err, false)
		}
		r.mu.Lock()
		if len(r.waiting) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// refreshView asks the peer for its current descriptor and updates p's
// view with it. The request is bounded by the latest deadline of the
// slices waiting for it and by Close.
func (p *peer) refreshView(waiting []*transport.Slice) error {
	deadline := time.Now().Add(p.t.cfg.Timeout)
	latest := time.Time{}
	for _, s := range waiting {
		if s.Deadline.After(latest) {
			latest = s.Deadline
		}
	}
	if !latest.IsZero() && latest.Before(deadline) {
		deadline = latest
	}
	ctx, cancel := context.WithDeadline(p.t.ctx, deadline)
	defer cancel()
	p.t.cfg.Refreshed()
	// The engine asks the peer over its handshake socket, which answers
	// with the live descriptor, even where a metadata store holds a
	// published copy that may lag behind it.
	desc, err := p.describe(ctx)
	if err != nil {
		return err
	}
	info, ok := p.t.info(desc)
	if !ok {
		return fmt.Errorf("%w: segment %s no longer offers it", ErrUnavailable, p.name)
	}
	return p.p.Update(info)
}

// retry settles a slice that waited for a refresh that ended with err.
// final: the refresh began after the slice missed, so a range it does not
// cover is not the peer's to accept.
func (p *peer) retry(s *transport.Slice, err error, final bool) {
	switch {
	case p.t.ctx.Err() != nil:
		s.Done(s, transport.ErrClosed)
	case errors.Is(err, transport.ErrClosed):
		s.Done(s, err) // the segment was closed under it
	case !time.Now().Before(s.Deadline):
		s.Done(s, fmt.Errorf("%w: waiting for a view of segment %s", transport.ErrTimeout, p.name))
	case errors.Is(err, ErrUnavailable):
		p.giveUp(s, err)
	case err != nil && errors.Is(err, ErrStale):
		p.requeue(s) // the peer freed memory while we looked
	case err != nil:
		p.passOn(s, err)
	case p.p.Covers(s.Remote, s.Length):
		p.resubmit(s)
	case final:
		s.Done(s, fmt.Errorf("%w: %#x+%d is not inside the registered memory of segment %s",
			transport.ErrRejected, s.Remote, s.Length, p.name))
	default:
		p.requeue(s)
	}
}

// resubmit sends a slice the refreshed view covers down the path again
// (or the next one, if this path gave up meanwhile). It runs on a
// refresher, which a full queue holds up at most until the slice's
// deadline.
func (p *peer) resubmit(s *transport.Slice) {
	p.Submit(context.Background(), s)
}

// requeue puts s back for the next refresh; the refresher calling it is
// still running and sees it.
func (p *peer) requeue(s *transport.Slice) {
	r := &p.refresh
	r.mu.Lock()
	r.waiting = append(r.waiting, s)
	r.mu.Unlock()
}

// giveUp sends p's traffic down the next path from now on: the peer cannot
// be reached through shared memory.
func (p *peer) giveUp(s *transport.Slice, err error) {
	if p.next != nil && p.stale.CompareAndSwap(false, true) {
		p.t.cfg.Logger.Info("same-host path unavailable, falling back", "segment", p.name,
			"to", p.next.Path(), "err", err)
	}
	p.passOn(s, err)
}

// passOn sends s down the next path (TCP, whose server checks the range
// itself); without one, s fails with err.
func (p *peer) passOn(s *transport.Slice, err error) {
	if p.next == nil {
		s.Done(s, fmt.Errorf("%w: %v", transport.ErrPeer, err))
		return
	}
	// Never block a copy worker or a refresher on the next path's queue.
	// Both run before Close waits on t.wg, so this Add is ordered before
	// it.
	p.t.wg.Add(1)
	go func() {
		defer p.t.wg.Done()
		p.next.Submit(context.Background(), s)
	}()
}
