// Package storefeed feeds the Conductor's prefix index from the Mooncake
// Store. It watches the master's readable keys (the WatchObjects stream of
// store/storepb: a snapshot, then every put, removal and eviction as it
// happens), keeps the keys that name KV blocks (conductor.KeyBlock), and
// tells a Sink, the Scheduler, which blocks the store gained and lost:
// the store's holder in the index then mirrors the store.
//
// When the watch ends (the master restarted or lost the lead, the feed
// fell behind, the network failed) the feed watches again, from a fresh
// snapshot, and reconciles: blocks the store lost meanwhile are evicted,
// new ones added. Until the first snapshot the index has no store blocks
// from the feed.
//
//	s, _ := conductor.New(conductor.Config{})
//	f, _ := storefeed.New(storefeed.Config{Masters: []string{"10.0.0.1:50051"}}, s)
//	go f.Run(ctx) // until ctx ends
package storefeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Sink receives the store's block changes; *conductor.Scheduler is one.
// The calls come from Run's goroutine, one at a time, and the slices are
// the feed's own: a sink must not keep them.
type Sink interface {
	StoreAdded(blocks []uint64)
	StoreEvicted(blocks []uint64)
}

var _ Sink = (*conductor.Scheduler)(nil)

// DefaultRetry is the wait before watching again after a watch ended.
const DefaultRetry = time.Second

// sinkBatch bounds the blocks of one Sink call: the Scheduler holds its
// lock for a call, and decisions wait meanwhile.
const sinkBatch = 4096

// Config configures a Feed.
type Config struct {
	// Masters are the store masters' gRPC addresses (host:port). Under HA
	// the feed tries them in turn until one leads; without, give one.
	Masters []string
	// Retry is the wait before watching again, after a watch ended or
	// failed on every master. Zero: DefaultRetry.
	Retry time.Duration
	// Logger receives the feed's logs. Zero: slog.Default().
	Logger *slog.Logger
	// TLS dials the masters over TLS (a CA, and a client certificate for
	// masters that require one); Token is presented on every call. Zero:
	// plaintext, no token.
	TLS   secure.TLS
	Token string
}

// ErrInvalid is wrapped by the errors of New about its arguments.
var ErrInvalid = errors.New("storefeed: invalid")

// Feed follows a store into a Sink. Run it once.
type Feed struct {
	cfg  Config
	sink Sink

	mu     sync.Mutex
	keys   map[string]uint64 // the block keys the store holds, by key
	counts map[uint64]int    // keys per block held
	syncs  int               // snapshots applied
}

// Stats is what a Feed has seen.
type Stats struct {
	// Keys and Blocks are the block keys the store holds and their
	// distinct blocks, as of the last event.
	Keys, Blocks int
	// Syncs is the number of snapshots applied: 1 after the first watch
	// synced, one more for each watch after.
	Syncs int
}

// New returns a feed of sink from the masters of cfg.
func New(cfg Config, sink Sink) (*Feed, error) {
	if len(cfg.Masters) == 0 {
		return nil, fmt.Errorf("%w Config.Masters: none", ErrInvalid)
	}
	if sink == nil {
		return nil, fmt.Errorf("%w: nil Sink", ErrInvalid)
	}
	if cfg.Retry < 0 {
		return nil, fmt.Errorf("%w Config.Retry: negative %v", ErrInvalid, cfg.Retry)
	}
	if cfg.Retry == 0 {
		cfg.Retry = DefaultRetry
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Feed{cfg: cfg, sink: sink, keys: make(map[string]uint64), counts: make(map[uint64]int)}, nil
}

// Stats returns what the feed has seen so far.
func (f *Feed) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Stats{Keys: len(f.keys), Blocks: len(f.counts), Syncs: f.syncs}
}

// Run watches the masters until ctx ends, then returns nil; an error only
// for a master address gRPC cannot use.
func (f *Feed) Run(ctx context.Context) error {
	creds := insecure.NewCredentials()
	tc, err := f.cfg.TLS.Client()
	if err != nil {
		return fmt.Errorf("storefeed: %w", err)
	}
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if f.cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(secure.PerRPC(f.cfg.Token)))
	}
	clients := make([]storepb.MasterClient, len(f.cfg.Masters))
	for i, addr := range f.cfg.Masters {
		conn, err := grpc.NewClient(addr, opts...)
		if err != nil {
			return fmt.Errorf("storefeed: master %s: %w", addr, err)
		}
		defer conn.Close()
		clients[i] = storepb.NewMasterClient(conn)
	}
	for next := 0; ctx.Err() == nil; {
		// Every master in turn, from the one that served last.
		for range clients {
			err := f.watch(ctx, clients[next])
			if ctx.Err() != nil {
				return nil
			}
			f.cfg.Logger.Warn("storefeed: watch ended; watching again", "master", f.cfg.Masters[next], "err", err)
			if errors.Is(err, errSynced) {
				break // it served: retry it first
			}
			next = (next + 1) % len(clients)
		}
		select {
		case <-ctx.Done():
		case <-time.After(f.cfg.Retry):
		}
	}
	return nil
}

// errSynced wraps the end of a watch that got past its snapshot.
var errSynced = errors.New("after sync")

// watch follows one watch until it ends.
func (f *Feed) watch(ctx context.Context, c storepb.MasterClient) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.WatchObjects(ctx, &storepb.WatchObjectsRequest{})
	if err != nil {
		return err
	}
	snap := make(map[string]uint64)
	for {
		resp, err := stream.Recv()
		if err != nil {
			if snap == nil {
				return fmt.Errorf("%w: %w", errSynced, err)
			}
			return err
		}
		if snap == nil {
			f.apply(resp.Events)
			continue
		}
		for _, ev := range resp.Events {
			if h, ok := conductor.KeyBlock(ev.Key); ok {
				snap[ev.Key] = h
			}
		}
		if resp.Synced {
			f.resync(snap)
			snap = nil
		}
	}
}

// resync makes snap the store's keys, telling the sink the difference.
func (f *Feed) resync(snap map[string]uint64) {
	counts := make(map[uint64]int, len(snap))
	for _, h := range snap {
		counts[h]++
	}
	f.mu.Lock()
	var gone, added []uint64
	for h := range f.counts {
		if counts[h] == 0 {
			gone = append(gone, h)
		}
	}
	for h := range counts {
		if f.counts[h] == 0 {
			added = append(added, h)
		}
	}
	f.keys, f.counts = snap, counts
	f.syncs++
	f.mu.Unlock()
	f.send(f.sink.StoreEvicted, gone)
	f.send(f.sink.StoreAdded, added)
	f.cfg.Logger.Info("storefeed: synced", "keys", len(snap), "blocks", len(counts),
		"evicted", len(gone), "added", len(added))
}

// apply applies a batch of events in order: consecutive changes of one
// kind go to the sink together.
func (f *Feed) apply(events []*storepb.ObjectEvent) {
	var run []uint64
	adding := false
	flush := func() {
		if adding {
			f.send(f.sink.StoreAdded, run)
		} else {
			f.send(f.sink.StoreEvicted, run)
		}
		run = run[:0]
	}
	for _, ev := range events {
		h, ok := conductor.KeyBlock(ev.Key)
		if !ok {
			continue
		}
		put := ev.Kind == storepb.ObjectEventKind_OBJECT_EVENT_KIND_PUT
		f.mu.Lock()
		changed := false
		if _, had := f.keys[ev.Key]; put && !had {
			f.keys[ev.Key] = h
			f.counts[h]++
			changed = f.counts[h] == 1
		} else if !put && had {
			delete(f.keys, ev.Key)
			if f.counts[h]--; f.counts[h] == 0 {
				delete(f.counts, h)
				changed = true
			}
		}
		f.mu.Unlock()
		if !changed {
			continue
		}
		if put != adding && len(run) > 0 {
			flush()
		}
		adding = put
		run = append(run, h)
	}
	if len(run) > 0 {
		flush()
	}
}

// send calls to with blocks in batches of sinkBatch.
func (f *Feed) send(to func([]uint64), blocks []uint64) {
	for len(blocks) > 0 {
		n := min(len(blocks), sinkBatch)
		to(blocks[:n])
		blocks = blocks[n:]
	}
}
