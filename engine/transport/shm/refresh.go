package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/shm"
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

// missed takes a slice the same-host view could not serve (shm.Pool calls
// it on a copy worker, so it must not block): a peer out of reach is left
// to TCP, a stale or short view is refreshed first.
func (e *Engine) missed(seg *segment, s *transport.Slice, err error) {
	if errors.Is(err, shm.ErrUnavailable) {
		e.giveUpShm(seg, s, err)
		return
	}
	r := &seg.refresh
	r.mu.Lock()
	r.waiting = append(r.waiting, s)
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start {
		// A copy worker calls this before Close waits on e.wg (Close stops
		// the workers first), so the Add is ordered before the Wait.
		e.wg.Add(1)
		go e.refresher(seg)
	}
}

// refresher refreshes seg's view until no slice waits for it.
func (e *Engine) refresher(seg *segment) {
	defer e.wg.Done()
	r := &seg.refresh
	for {
		r.mu.Lock()
		wait := time.Until(r.last.Add(minRefresh))
		r.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-e.ctx.Done():
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
		err := e.refreshView(seg, missed)
		for _, s := range missed {
			e.retry(seg, s, err, true)
		}
		// Slices that missed while it ran may have missed the old view:
		// the new one serves those it covers; the rest wait for the next.
		r.mu.Lock()
		more := r.waiting
		r.waiting = nil
		r.mu.Unlock()
		for _, s := range more {
			e.retry(seg, s, err, false)
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

// refreshView asks the peer for its current descriptor and updates seg's
// view with it. The request is bounded by the latest deadline of the
// slices waiting for it and by Close.
func (e *Engine) refreshView(seg *segment, waiting []*transport.Slice) error {
	deadline := time.Now().Add(e.cfg.Timeout)
	latest := time.Time{}
	for _, s := range waiting {
		if s.Deadline.After(latest) {
			latest = s.Deadline
		}
	}
	if !latest.IsZero() && latest.Before(deadline) {
		deadline = latest
	}
	ctx, cancel := context.WithDeadline(e.ctx, deadline)
	defer cancel()
	e.m.refreshes.Inc()
	// The handshake socket answers with the live descriptor, even where a
	// metadata store holds a published copy that may lag behind it.
	desc, err := e.askDescriptor(ctx, "refresh segment "+seg.name, seg.rpcAddr)
	if err != nil {
		return err
	}
	info, ok := e.shmInfo(desc)
	if !ok {
		return fmt.Errorf("%w: segment %s no longer offers it", shm.ErrUnavailable, seg.name)
	}
	if err := seg.shm.Update(info); err != nil {
		return err
	}
	seg.desc.Store(desc)
	return nil
}

// retry settles a slice that waited for a refresh that ended with err.
// final: the refresh began after the slice missed, so a range it does not
// cover is not the peer's to accept.
func (e *Engine) retry(seg *segment, s *transport.Slice, err error, final bool) {
	switch {
	case e.ctx.Err() != nil:
		s.Done(s, transport.ErrClosed)
	case errors.Is(err, transport.ErrClosed):
		s.Done(s, err) // the segment was closed under it
	case !time.Now().Before(s.Deadline):
		s.Done(s, fmt.Errorf("%w: waiting for a view of segment %s", transport.ErrTimeout, seg.name))
	case errors.Is(err, shm.ErrUnavailable):
		e.giveUpShm(seg, s, err)
	case err != nil && errors.Is(err, shm.ErrStale):
		e.requeue(seg, s) // the peer freed memory while we looked
	case err != nil:
		e.viaTCP(seg, s, err)
	case seg.shm.Covers(s.Remote, s.Length):
		e.route(seg, s)
	case final:
		s.Done(s, fmt.Errorf("%w: %#x+%d is not inside the registered memory of segment %s",
			transport.ErrRejected, s.Remote, s.Length, seg.name))
	default:
		e.requeue(seg, s)
	}
}

// requeue puts s back for the next refresh; the refresher calling it is
// still running and sees it.
func (e *Engine) requeue(seg *segment, s *transport.Slice) {
	r := &seg.refresh
	r.mu.Lock()
	r.waiting = append(r.waiting, s)
	r.mu.Unlock()
}

// giveUpShm sends seg's traffic over TCP from now on: the peer cannot be
// reached through shared memory.
func (e *Engine) giveUpShm(seg *segment, s *transport.Slice, err error) {
	if seg.stale.CompareAndSwap(false, true) {
		e.log.Info("same-host path unavailable, falling back to TCP", "segment", seg.name, "err", err)
	}
	e.viaTCP(seg, s, err)
}

// viaTCP sends s over TCP, whose server checks the range itself; without
// TCP, s fails with err.
func (e *Engine) viaTCP(seg *segment, s *transport.Slice, err error) {
	if seg.tcpPeer == nil || e.cfg.Transport == "shm" {
		s.Done(s, fmt.Errorf("%w: %v", transport.ErrPeer, err))
		return
	}
	// Never block a copy worker or a refresher on a TCP queue. Both run
	// before Close waits on e.wg, so this Add is ordered before it.
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		seg.tcpPeer.Submit(s)
	}()
}
