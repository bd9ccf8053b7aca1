package te

import (
	"context"
	"errors"
	"fmt"
	"github.com/mooncake-go/mooncake/internal/hist"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-go/mooncake/engine"
)

// workload is the initiator: our engine, its local buffer and the opened
// target segment.
type workload struct {
	o      Options
	e      *engine.Engine
	buf    buffer
	seg    engine.SegmentID
	remote uint64 // target buffer address
}

func newWorkload(ctx context.Context, o Options, t TargetInfo) (w *workload, err error) {
	if t.Length < uint64(o.BufferSize) {
		return nil, fmt.Errorf("te: target buffer of %d bytes, %d wanted", t.Length, o.BufferSize)
	}
	e, err := engine.New(ctx, engine.Config{Host: "127.0.0.1", Transport: o.Transport, Lanes: o.Lanes,
		SliceSize: o.SliceSize, Logger: o.Logger, Metadata: o.Metadata})
	if err != nil {
		return nil, fmt.Errorf("te: initiator engine: %w", err)
	}
	w = &workload{o: o, e: e, remote: t.Addr}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if w.buf, err = allocate(ctx, e, o.BufferSize, o.gpu()); err != nil {
		return nil, fmt.Errorf("te: initiator buffer: %w", err)
	}
	if w.seg, err = e.OpenSegment(ctx, t.Segment); err != nil {
		return nil, fmt.Errorf("te: open target segment: %w", err)
	}
	bufs, err := e.SegmentBuffers(w.seg)
	if err != nil {
		return nil, err
	}
	for _, b := range bufs {
		if b.Addr == t.Addr && b.Length >= uint64(o.BufferSize) {
			return w, nil
		}
	}
	return nil, fmt.Errorf("te: segment %s does not publish buffer %#x+%d", t.Segment, t.Addr, o.BufferSize)
}

func (w *workload) close() error {
	var errs []error
	if w.buf != nil {
		errs = append(errs, w.buf.Free())
	}
	return errors.Join(append(errs, w.e.Close())...)
}

// worker is one submitting goroutine: its requests, its share of the
// buffers and its latency histogram.
type worker struct {
	w          *workload
	reqs       []engine.Request
	off, span  int // share of the buffers
	pos        int // next offset within the share
	hist       hist.Histogram
	bytes, req uint64
	overhead   time.Duration // in AllocateBatch and FreeBatch
	batches    int
}

func (w *workload) workers() []*worker {
	ws := make([]*worker, w.o.Threads)
	for i := range ws {
		off, span := part(w.o.BufferSize, w.o.BlockSize, i, w.o.Threads)
		ws[i] = &worker{w: w, reqs: make([]engine.Request, w.o.BatchSize), off: off, span: span}
	}
	return ws
}

// batch submits one batch of requests at the worker's next offsets, waits
// for it and checks that every task completed.
func (k *worker) batch(ctx context.Context) (lat time.Duration, err error) {
	w, block := k.w, k.w.o.BlockSize
	local := w.buf.Addr()
	for i := range k.reqs {
		if k.pos+block > k.span {
			k.pos = 0
		}
		off := k.off + k.pos
		k.pos += block
		k.reqs[i] = engine.Request{Op: w.o.Op, Local: local + uintptr(off), Segment: w.seg,
			Remote: w.remote + uint64(off), Length: uint64(block)}
	}
	// A batch holds BatchSize tasks over its lifetime (as Mooncake's), so
	// each round allocates a fresh one; its cost is part of the figures.
	t0 := time.Now()
	id, err := w.e.AllocateBatch(len(k.reqs))
	if err != nil {
		return 0, fmt.Errorf("te: allocate batch: %w", err)
	}
	start := time.Now()
	if err := w.e.Submit(ctx, id, k.reqs); err != nil {
		w.e.FreeBatch(id)
		return 0, fmt.Errorf("te: submit: %w", err)
	}
	st, err := w.e.Wait(ctx, id)
	done := time.Now()
	lat = done.Sub(start)
	if err != nil {
		return 0, fmt.Errorf("te: wait: %w", err) // the batch stays busy: the engine's Close fails it
	}
	// The summary is Completed only when every task of the batch is.
	if st.Status != engine.Completed {
		return 0, w.failure(id, st)
	}
	if err := w.e.FreeBatch(id); err != nil {
		return 0, fmt.Errorf("te: free batch: %w", err)
	}
	k.overhead += start.Sub(t0) + time.Since(done)
	k.batches++
	return lat, nil
}

// failure describes the first task of a batch that did not complete.
func (w *workload) failure(id engine.BatchID, sum engine.TransferStatus) error {
	for i := range w.o.BatchSize {
		ts, err := w.e.TaskStatus(id, i)
		if err == nil && ts.Status != engine.Completed {
			return fmt.Errorf("te: %s of %d bytes (task %d of batch %d) ended %s: %v",
				w.o.Op, w.o.BlockSize, i, id, ts.Status, ts.Err)
		}
	}
	return fmt.Errorf("te: batch %d ended %s: %v", id, sum.Status, sum.Err)
}

// warmUp runs every worker once through its share of the buffers.
func (w *workload) warmUp(ctx context.Context) error {
	return w.each(ctx, func(ctx context.Context, k *worker) error {
		for n := 0; n < k.span; n += w.o.BatchSize * w.o.BlockSize {
			if _, err := k.batch(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// measure runs every worker for the configured duration.
func (w *workload) measure(ctx context.Context, moved *atomic.Uint64) (Figures, error) {
	ws := w.workers()
	per := uint64(w.o.BatchSize)
	bytes := per * uint64(w.o.BlockSize)
	start := time.Now()
	end := start.Add(w.o.Duration)
	err := w.run(ctx, ws, func(ctx context.Context, k *worker) error {
		for time.Now().Before(end) {
			lat, err := k.batch(ctx)
			if err != nil {
				return err
			}
			// Every request of the batch is done when Wait returns.
			k.hist.Record(lat, per)
			k.bytes += bytes
			k.req += per
			moved.Add(bytes)
		}
		return nil
	})
	elapsed := time.Since(start)
	if err != nil {
		return Figures{}, err
	}
	var h hist.Histogram
	var total, reqs uint64
	var overhead time.Duration
	var batches int
	for _, k := range ws {
		h.Merge(&k.hist)
		total += k.bytes
		reqs += k.req
		overhead += k.overhead
		batches += k.batches
	}
	f := figures(total, elapsed)
	f.Requests = reqs
	f.P50us = float64(h.Quantile(0.50)) / 1e3
	f.P99us = float64(h.Quantile(0.99)) / 1e3
	if batches > 0 {
		f.BatchOverheadUS = overhead.Seconds() * 1e6 / float64(batches)
	}
	return f, nil
}

func (w *workload) each(ctx context.Context, fn func(context.Context, *worker) error) error {
	return w.run(ctx, w.workers(), fn)
}

// run runs fn on every worker concurrently; the first error stops the
// others and is returned.
func (w *workload) run(ctx context.Context, ws []*worker, fn func(context.Context, *worker) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, k := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, k); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}
