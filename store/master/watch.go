package master

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// DefaultWatchBuffer is the number of events a watcher may fall behind by
// before it is dropped.
const DefaultWatchBuffer = 1 << 16

// ObjectEvent is a key becoming readable or ceasing to be, as a Watch
// reports it.
type ObjectEvent struct {
	Kind storepb.ObjectEventKind
	Key  string
}

// Watch follows the readable keys of a Service: Service.Watch returns the
// keys readable when it began, and Events delivers every change after
// them, in order per key. Applying the events, in order, to the snapshot
// gives the readable keys; a key may appear in both (a change racing the
// snapshot), which the order makes right.
//
// Events are sent while the key's shard is locked, so they never wait: a
// watcher more than its buffer behind is dropped, and Done says so.
type Watch struct {
	svc    *Service
	events chan ObjectEvent
	done   chan struct{}
	once   sync.Once
	// err is why the watch ended: ErrWatchBehind, ErrWatchEnded, or nil.
	err error
}

// Events delivers the changes; it is never closed (select on Done too).
func (w *Watch) Events() <-chan ObjectEvent { return w.events }

// Done is closed when the watch ends: Close, a watcher dropped for falling
// behind, or a service that stopped serving (its master lost the lead).
// Events sent before it may still be waiting in Events.
func (w *Watch) Done() <-chan struct{} { return w.done }

// Err says why the watch ended, once Done is closed.
func (w *Watch) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// Close ends the watch. It is idempotent.
func (w *Watch) Close() { w.svc.unwatch(w, nil) }

// Why a watch ends, besides Close (Err nil).
var (
	// ErrWatchBehind: the watcher fell more than its buffer behind.
	ErrWatchBehind = errors.New("master: watch fell too far behind; watch again")
	// ErrWatchEnded: the service stopped serving (its master lost the lead).
	ErrWatchEnded = errors.New("master: watch ended, the master stopped serving; watch again")
)

// watchers is the Service's set of watches.
type watchers struct {
	mu  sync.Mutex
	set map[*Watch]struct{}
	// n is len(set): with no watch, emit costs one atomic load. A put that
	// emit skipped took its shard lock before the watch registered, so the
	// watch's snapshot walk, which takes that lock after, sees it.
	n atomic.Int32
}

// Watch starts a watch that may fall buffer events behind (zero:
// DefaultWatchBuffer) and returns it with the keys readable now.
func (s *Service) Watch(buffer int) (*Watch, []string) {
	if buffer <= 0 {
		buffer = DefaultWatchBuffer
	}
	w := &Watch{svc: s, events: make(chan ObjectEvent, buffer), done: make(chan struct{})}
	// Registered before the snapshot: a change during the walk is both
	// in an event and, maybe, in the snapshot, never in neither.
	s.watch.mu.Lock()
	if s.watch.set == nil {
		s.watch.set = make(map[*Watch]struct{})
	}
	s.watch.set[w] = struct{}{}
	s.watch.n.Store(int32(len(s.watch.set)))
	s.watch.mu.Unlock()
	return w, s.readableKeys()
}

// emit sends an event to every watch. The key's shard lock is held, which
// orders a key's events and the snapshot walk.
func (s *Service) emit(kind storepb.ObjectEventKind, key string) {
	if s.watch.n.Load() == 0 {
		return
	}
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	for w := range s.watch.set {
		select {
		case w.events <- ObjectEvent{Kind: kind, Key: key}:
		default:
			s.unwatchLocked(w, ErrWatchBehind)
		}
	}
}

func (s *Service) unwatch(w *Watch, err error) {
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	s.unwatchLocked(w, err)
}

func (s *Service) unwatchLocked(w *Watch, err error) {
	w.once.Do(func() {
		delete(s.watch.set, w)
		s.watch.n.Store(int32(len(s.watch.set)))
		w.err = err
		close(w.done)
	})
}

// endWatches ends every watch: the service stops serving.
func (s *Service) endWatches() {
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	for w := range s.watch.set {
		s.unwatchLocked(w, ErrWatchEnded)
	}
}
