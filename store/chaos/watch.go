package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// watcher follows the leading master's WatchObjects stream and records
// the evictions it reports in the history: the checker's only excuse for
// an acknowledged write gone missing, besides the workload's removes.
// Removals it reports are not recorded: a key removed by anyone but the
// workload is lost as far as the checker knows.
type watcher struct {
	h      *History
	leader func(context.Context) (string, error)

	mu    sync.Mutex
	waits map[string]chan struct{}

	// readable is what the last watch said is readable, nil before the
	// first snapshot; lostAt is when that watch ended. Only run's
	// goroutine uses them.
	readable map[string]bool
	lostAt   time.Duration
}

func newWatcher(h *History, leader func(context.Context) (string, error)) *watcher {
	return &watcher{h: h, leader: leader, waits: map[string]chan struct{}{}}
}

// run watches until ctx ends, watching again (on the leader of the
// moment) whenever a watch ends. Evictions while no watch is open are not
// seen; each such gap is noted in the history.
func (w *watcher) run(ctx context.Context) {
	var gap time.Duration // when the open watch ended; -1: a watch is open or none was yet
	gap = -1
	for ctx.Err() == nil {
		addr, err := w.leader(ctx)
		if err == nil {
			err = w.watch(ctx, addr, func() {
				if gap >= 0 {
					now := w.h.Now()
					w.h.Note(fmt.Sprintf("%v: the eviction watch resumed on master %s after %v without one",
						now.Round(time.Millisecond), addr, (now - gap).Round(time.Millisecond)))
				}
				gap = -1
			})
		}
		if ctx.Err() != nil {
			return
		}
		if gap < 0 {
			gap = w.h.Now()
			w.lostAt = gap
			w.h.Note(fmt.Sprintf("%v: the eviction watch of master %s ended: %v",
				gap.Round(time.Millisecond), addr, err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// watch follows one watch of the master at addr until it ends; opened is
// called once its snapshot is whole.
func (w *watcher) watch(ctx context.Context, addr string, opened func()) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := storepb.NewMasterClient(conn).WatchObjects(ctx, &storepb.WatchObjectsRequest{})
	if err != nil {
		return err
	}
	snap := map[string]bool{} // the snapshot, until it is whole
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		at := w.h.Now()
		for _, ev := range resp.Events {
			switch ev.Kind {
			case storepb.ObjectEventKind_OBJECT_EVENT_KIND_EVICTED:
				w.h.AddEviction(Eviction{At: at, Key: ev.Key})
			case storepb.ObjectEventKind_OBJECT_EVENT_KIND_PUT:
				w.seen(ev.Key)
			}
			switch {
			case snap != nil:
				snap[ev.Key] = true
			case ev.Kind == storepb.ObjectEventKind_OBJECT_EVENT_KIND_PUT:
				w.readable[ev.Key] = true
			default:
				delete(w.readable, ev.Key)
			}
		}
		if snap != nil && resp.Synced {
			w.resync(snap, at)
			snap = nil
			opened()
		}
	}
}

// resync takes a new watch's snapshot: keys readable when the last watch
// ended and missing now went while no watch was open, unseen, evicted or
// lost; the history notes them (they excuse nothing).
func (w *watcher) resync(snap map[string]bool, at time.Duration) {
	for k := range w.readable {
		if !snap[k] {
			w.h.AddVanished(Vanished{Key: k, From: w.lostAt, To: at})
		}
	}
	w.readable = snap
}

// await returns a channel closed once the watch reports key readable:
// every event the master emitted before it has been seen then, since a
// watch delivers events in the order they happened.
func (w *watcher) await(key string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	w.waits[key] = ch
	return ch
}

func (w *watcher) seen(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.waits[key]; ok {
		close(ch)
		delete(w.waits, key)
	}
}
