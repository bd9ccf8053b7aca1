package store

import (
	"context"
	"errors"
	"fmt"
	"github.com/mooncake-go/mooncake/internal/hist"
	"sync"
	"time"
)

// Worker is one client of the store under test. Drive calls each worker
// from one goroutine at a time, and reuses the keys slice after a call
// returns (the strings themselves never change).
type Worker interface {
	// Put stores one object of Options.ValueSize bytes under each key, in
	// one call (one request, or one batch of them).
	Put(ctx context.Context, keys []string) error
	// Get reads the objects under keys into the worker's memory, in one
	// call, and fails if one is missing or not Options.ValueSize bytes.
	Get(ctx context.Context, keys []string) error
	// Close releases the worker's connection and memory.
	Close() error
}

// Drive measures one run of o against the store the workers of newWorker
// reach: it makes Clients workers (newWorker(0) to newWorker(Clients-1)),
// preloads the working set for a get run, lets every worker call in a loop
// for Warmup, then for Duration with the clock running, and closes them.
//
// Keys are named by Key(o.KeyPrefix, i). A get run reads keys 0 to Keys-1,
// BatchSize consecutive ones per call, client c starting at c*Keys/Clients.
// A put run writes keys from Keys upward, each once, since a store may
// treat the put of an existing key as a no-op: Drive wants a store holding
// none of its keys, so start a fresh one per run or give each run its own
// KeyPrefix.
//
// The clock runs from the start of the timed phase until the last call
// started before its end has returned; every call started in it counts.
// The Name of the result is left to the caller. One run is noisy: repeat
// and take the Median.
func Drive(ctx context.Context, o Options, newWorker func(i int) (Worker, error)) (res Result, err error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	o = o.WithDefaults()
	workers := make([]Worker, 0, o.Clients)
	defer func() {
		for _, w := range workers {
			err = errors.Join(err, w.Close())
		}
	}()
	for i := range o.Clients {
		w, err := newWorker(i)
		if err != nil {
			return Result{}, fmt.Errorf("store: worker %d: %w", i, err)
		}
		workers = append(workers, w)
	}
	clients := make([]*driven, len(workers))
	for i, w := range workers {
		clients[i] = &driven{o: o, i: i, w: w, cursor: i * o.Keys / o.Clients}
	}
	if o.Op == OpGet {
		names := make([]string, o.Keys, o.Keys+o.BatchSize)
		for i := range names {
			names[i] = Key(o.KeyPrefix, i)
		}
		// A batch may wrap around the end of the working set.
		names = append(names, names[:o.BatchSize]...)
		if err := each(ctx, clients, func(ctx context.Context, c *driven) error {
			c.names = names
			return c.preload(ctx)
		}); err != nil {
			return Result{}, err
		}
	}
	if o.Warmup > 0 {
		end := time.Now().Add(o.Warmup)
		if err := each(ctx, clients, func(ctx context.Context, c *driven) error { return c.loop(ctx, end, nil) }); err != nil {
			return Result{}, err
		}
	}
	hists := make([]hist.Histogram, len(clients))
	start := time.Now()
	end := start.Add(o.Duration)
	if err := each(ctx, clients, func(ctx context.Context, c *driven) error { return c.loop(ctx, end, &hists[c.i]) }); err != nil {
		return Result{}, err
	}
	res.Seconds = time.Since(start).Seconds()
	var all hist.Histogram
	for i := range hists {
		all.Merge(&hists[i])
	}
	res.Calls = all.Total
	res.fill(o, &all)
	return res, nil
}

// driven is one worker and where it is in the key space.
type driven struct {
	o      Options
	i      int
	w      Worker
	names  []string // get: the working set, then its first batch again
	cursor int      // get: the first key of the next call
	calls  int      // put: calls made, warm-up included
	keys   []string // put: reused for every call
}

// preload stores client c's share of the working set.
func (c *driven) preload(ctx context.Context) error {
	o := c.o
	lo, hi := c.i*o.Keys/o.Clients, (c.i+1)*o.Keys/o.Clients
	for first := lo; first < hi; first += o.BatchSize {
		if err := c.w.Put(ctx, c.names[first:min(first+o.BatchSize, hi)]); err != nil {
			return fmt.Errorf("store: client %d: preload: %w", c.i, err)
		}
	}
	return nil
}

// loop calls until end, recording each call's latency in h when it is set.
func (c *driven) loop(ctx context.Context, end time.Time, h *hist.Histogram) error {
	o := c.o
	for t := time.Now(); t.Before(end); {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		if o.Op == OpGet {
			keys := c.names[c.cursor : c.cursor+o.BatchSize]
			c.cursor = (c.cursor + o.BatchSize) % o.Keys
			t = time.Now()
			err = c.w.Get(ctx, keys)
		} else {
			// Clients interleave their batches of fresh keys, so no two
			// ever write the same one.
			base := o.Keys + (c.calls*o.Clients+c.i)*o.BatchSize
			c.keys = c.keys[:0]
			for j := range o.BatchSize {
				c.keys = append(c.keys, Key(o.KeyPrefix, base+j))
			}
			c.calls++
			t = time.Now()
			err = c.w.Put(ctx, c.keys)
		}
		if err != nil {
			return fmt.Errorf("store: client %d: %s: %w", c.i, o.Op, err)
		}
		now := time.Now()
		if h != nil {
			h.Record(now.Sub(t), 1)
		}
		t = now
	}
	return nil
}

// each runs fn for every client, each on its own goroutine, and returns
// the first error; the others are then cancelled.
func each(ctx context.Context, clients []*driven, fn func(context.Context, *driven) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			if err := fn(ctx, c); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}
