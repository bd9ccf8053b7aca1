package trace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-go/mooncake/internal/hist"
)

// Store is what the replay needs from a KV-cache store; keys are block keys.
type Store interface {
	// BatchExist reports for each key whether it is readable.
	BatchExist(ctx context.Context, keys []string) ([]bool, error)
	// BatchGet reads each key into dst[i] (len(dst[i]) is the block size)
	// and returns one error per key: nil means a hit, read completely.
	BatchGet(ctx context.Context, keys []string, dst [][]byte) []error
	// BatchPut writes each key; one error per key. The values are valid
	// during the call only: the replay reuses them.
	BatchPut(ctx context.Context, keys []string, values [][]byte) []error
}

// Defaults of Options.
const (
	// DefaultBlockBytes is 1/2560 of RealBlockBytes: the whole trace then
	// writes about 12 GB instead of 30 TB.
	DefaultBlockBytes = 64 << 10
	// DefaultConcurrency is the number of requests in flight.
	DefaultConcurrency = 8
	// DefaultKeyPrefix starts every block key: "blk-" + hash id.
	DefaultKeyPrefix = "blk-"
	// DefaultProgressEvery is the period of the plain progress line.
	DefaultProgressEvery = 10 * time.Second
)

// Options configures a replay. Zero fields take the defaults named.
type Options struct {
	// Trace is the requests, replayed in their order. Zero: Conversation().
	Trace []Request
	// MaxRequests replays only the first MaxRequests requests. Zero: all.
	MaxRequests int
	// Speedup divides the trace's time: a request starts no earlier than
	// its timestamp / Speedup after the first one (10 replays the hour of
	// the conversation trace in six minutes). Zero: as fast as the workers
	// go, each starting the next request as soon as it is free.
	Speedup float64
	// Concurrency is the number of workers, hence of requests in flight.
	// Requests are handed out in trace order. Zero: DefaultConcurrency.
	Concurrency int
	// BlockBytes is the payload of one block. Memory: each worker holds
	// one buffer as large as its longest request (247 blocks in the
	// conversation trace). Zero: DefaultBlockBytes.
	BlockBytes int
	// KeyPrefix starts every key; the hash id follows in decimal. A
	// prefix of its own keeps a replay from finding the blocks of an
	// earlier one in the same store. Zero: DefaultKeyPrefix.
	KeyPrefix string
	// Progress, when set, receives a progress bar while replaying if it is
	// a terminal, or else a plain line every ProgressEvery. The command
	// line passes os.Stderr.
	Progress io.Writer
	// ProgressEvery is the period of the plain progress line. Zero:
	// DefaultProgressEvery.
	ProgressEvery time.Duration
}

// Validate names the first bad field.
func (o *Options) Validate() error {
	switch {
	case o.MaxRequests < 0:
		return fmt.Errorf("trace: MaxRequests %d", o.MaxRequests)
	case o.Speedup < 0 || math.IsNaN(o.Speedup) || math.IsInf(o.Speedup, 0):
		return fmt.Errorf("trace: Speedup %g", o.Speedup)
	case o.Concurrency < 0:
		return fmt.Errorf("trace: Concurrency %d", o.Concurrency)
	case o.BlockBytes < 0:
		return fmt.Errorf("trace: BlockBytes %d", o.BlockBytes)
	case o.ProgressEvery < 0:
		return fmt.Errorf("trace: ProgressEvery %v", o.ProgressEvery)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Trace == nil {
		o.Trace = Conversation()
	}
	if o.MaxRequests > 0 && o.MaxRequests < len(o.Trace) {
		o.Trace = o.Trace[:o.MaxRequests]
	}
	o.Concurrency = cmp.Or(o.Concurrency, DefaultConcurrency)
	o.BlockBytes = cmp.Or(o.BlockBytes, DefaultBlockBytes)
	o.KeyPrefix = cmp.Or(o.KeyPrefix, DefaultKeyPrefix)
	o.ProgressEvery = cmp.Or(o.ProgressEvery, DefaultProgressEvery)
	return o
}

// ErrCorrupt is wrapped by Replay's error when a block read back differs
// from what was written, even by one byte.
var ErrCorrupt = errors.New("trace: corrupt block")

// RequestResult is what one request did. Block counts are in blocks of
// BlockTokens tokens.
type RequestResult struct {
	// Index is the request's position in the trace, from 0.
	Index int
	// Timestamp is the trace's arrival time in milliseconds.
	Timestamp int64
	// Start is when a worker took the request, from the replay's start.
	Start time.Duration
	// Lag is how much later than its scaled timestamp the request started
	// (all workers were busy); zero when Options.Speedup is zero.
	Lag time.Duration
	// InputBlocks is the number of blocks of the prompt.
	InputBlocks int
	// ExistBlocks is the stored prefix BatchExist found: the leading run
	// of keys reported readable.
	ExistBlocks int
	// HitBlocks is the prefix actually read: ExistBlocks cut at the first
	// block whose get failed or whose bytes were wrong.
	HitBlocks int
	// InfiniteHitBlocks is the longest prefix of blocks that any earlier
	// request of the trace had: HitBlocks with a store that never evicts
	// and requests replayed one at a time.
	InfiniteHitBlocks int
	// PutBlocks is the number of blocks written: those from HitBlocks on
	// that the store did not already hold readable.
	PutBlocks int
	// BytesRead counts the blocks BatchGet returned without error.
	BytesRead int64
	// BytesWritten counts the blocks BatchPut stored without error.
	BytesWritten int64
	// ExistLatency, GetLatency and PutLatency time the BatchExist,
	// BatchGet and BatchPut calls; zero for a call not made (no stored
	// prefix, nothing to put).
	ExistLatency, GetLatency, PutLatency time.Duration
	// ExistFailed is set when BatchExist failed; the request then counts
	// as finding nothing stored.
	ExistFailed bool
	// FailedGets, FailedPuts are the keys BatchGet, BatchPut failed.
	FailedGets, FailedPuts int
	// Corrupt is the number of blocks read whose bytes were wrong.
	Corrupt int
	// Err is the request's first error, a corrupt block before any other;
	// empty when it had none.
	Err string
}

// Result sums up a replay.
type Result struct {
	// Requests is the number of requests replayed.
	Requests int
	// Blocks, HitBlocks, InfiniteHitBlocks and PutBlocks sum the same
	// fields of PerRequest.
	Blocks, HitBlocks, InfiniteHitBlocks, PutBlocks int64
	// HitRatio is HitBlocks / Blocks.
	HitRatio float64
	// InfiniteHitRatio is InfiniteHitBlocks / Blocks: the bound an
	// infinite cache would reach.
	InfiniteHitRatio float64
	// BytesRead and BytesWritten sum the same fields of PerRequest.
	BytesRead, BytesWritten int64
	// GB is the data moved, read plus written, in units of 1e9 bytes.
	GB float64
	// Seconds is the wall time of the replay.
	Seconds float64
	// GBPerS is GB / Seconds.
	GBPerS float64
	// Gets and Puts are the numbers of BatchGet and BatchPut calls.
	Gets, Puts int
	// GetP50, GetP99, PutP50 and PutP99 are quantiles of the latency of
	// those calls.
	GetP50, GetP99, PutP50, PutP99 time.Duration
	// MaxLag is the largest RequestResult.Lag: how far the replay fell
	// behind the scaled trace.
	MaxLag time.Duration
	// Corrupt is the number of blocks read back wrong; Replay's error
	// names the first.
	Corrupt int
	// FailedExists counts the failed BatchExist calls; FailedGets and
	// FailedPuts the keys that BatchGet and BatchPut failed.
	FailedExists, FailedGets, FailedPuts int
	// BlockBytes, Concurrency, Speedup and KeyPrefix are the options the
	// replay ran with, defaults applied.
	BlockBytes  int
	Concurrency int
	Speedup     float64
	KeyPrefix   string
	// PerRequest has one entry per request replayed, in trace order.
	PerRequest []RequestResult
}

// Replay runs the trace through s, request by request as a prefill would:
// look up the longest stored prefix of the prompt's blocks (BatchExist),
// read it (BatchGet) and check every byte, then store the blocks it had to
// compute (BatchPut). Store errors are counted, not fatal. The error is
// ErrCorrupt, wrapped, if any block read back wrong, or the context's if it
// ended first; in both cases the Result covers the requests started.
func Replay(ctx context.Context, s Store, opts Options) (*Result, error) {
	if s == nil {
		return nil, errors.New("trace: nil Store")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	rp := &replay{store: s, opts: o, reqs: o.Trace, bound: infiniteHits(o.Trace),
		results: make([]RequestResult, len(o.Trace))}
	return rp.run(ctx)
}

// infiniteHits returns, for each request, the longest prefix of its blocks
// that earlier requests had. Hash ids are chained, so the first unseen
// block ends the prefix.
func infiniteHits(reqs []Request) []int {
	seen := make(map[int64]struct{})
	hits := make([]int, len(reqs))
	for i, r := range reqs {
		n := 0
		for n < len(r.HashIDs) {
			if _, ok := seen[r.HashIDs[n]]; !ok {
				break
			}
			n++
		}
		hits[i] = n
		for _, id := range r.HashIDs {
			seen[id] = struct{}{}
		}
	}
	return hits
}

// replay is one run of Replay. The dispatcher hands out request indexes;
// each worker writes only the results of the requests it took; the
// counters are shared with the progress reporter.
type replay struct {
	store   Store
	opts    Options
	reqs    []Request
	bound   []int
	results []RequestResult
	start   time.Time
	counts  counters
}

// counters are the running totals the progress reporter shows.
type counters struct {
	done, blocks, hits, bound, bytes, errors atomic.Int64
}

func (rp *replay) run(ctx context.Context) (*Result, error) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	rp.start = time.Now()
	for range min(rp.opts.Concurrency, len(rp.reqs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := worker{rp: rp}
			for i := range jobs {
				w.do(ctx, i)
			}
		}()
	}
	prog := startProgress(rp.opts.Progress, rp.opts.ProgressEvery, len(rp.reqs), &rp.counts, rp.start)
	started, err := rp.dispatch(ctx, jobs)
	close(jobs)
	wg.Wait()
	prog.stop()
	res := rp.summarize(started, time.Since(rp.start))
	if err != nil {
		return res, fmt.Errorf("trace: replay stopped after %d of %d requests: %w", started, len(rp.reqs), err)
	}
	if res.Corrupt > 0 {
		i := slices.IndexFunc(res.PerRequest, func(r RequestResult) bool { return r.Corrupt > 0 })
		r := res.PerRequest[i]
		return res, fmt.Errorf("%w: %d blocks in all, first in request %d: %s", ErrCorrupt, res.Corrupt, r.Index, r.Err)
	}
	return res, nil
}

// dispatch hands the requests to the workers in order, each no earlier
// than its scaled timestamp, and returns how many it handed out.
func (rp *replay) dispatch(ctx context.Context, jobs chan<- int) (int, error) {
	var timer *time.Timer
	for i := range rp.reqs {
		if err := ctx.Err(); err != nil {
			return i, err
		}
		if d := time.Until(rp.due(i)); d > 0 {
			if timer == nil {
				timer = time.NewTimer(d)
				defer timer.Stop()
			} else {
				timer.Reset(d)
			}
			select {
			case <-timer.C:
			case <-ctx.Done():
				return i, ctx.Err()
			}
		}
		select {
		case jobs <- i:
		case <-ctx.Done():
			return i, ctx.Err()
		}
	}
	return len(rp.reqs), nil
}

// due is when request i may start: the replay's start when Speedup is zero.
func (rp *replay) due(i int) time.Time {
	if rp.opts.Speedup == 0 {
		return rp.start
	}
	ms := float64(rp.reqs[i].Timestamp - rp.reqs[0].Timestamp)
	return rp.start.Add(time.Duration(ms * float64(time.Millisecond) / rp.opts.Speedup))
}

// worker replays requests one at a time, reusing its buffers.
type worker struct {
	rp       *replay
	keys     []string
	buf      []byte
	blocks   [][]byte
	readable []bool
	putKeys  []string
	putVals  [][]byte
}

// do replays request i into rp.results[i].
func (w *worker) do(ctx context.Context, i int) {
	rp, req := w.rp, w.rp.reqs[i]
	bs := rp.opts.BlockBytes
	n := len(req.HashIDs)
	res := &rp.results[i]
	*res = RequestResult{Index: i, Timestamp: req.Timestamp, Start: time.Since(rp.start),
		InputBlocks: n, InfiniteHitBlocks: rp.bound[i]}
	if rp.opts.Speedup > 0 {
		res.Lag = max(time.Since(rp.due(i)), 0)
	}
	w.keys = w.keys[:0]
	for _, id := range req.HashIDs {
		w.keys = append(w.keys, rp.opts.KeyPrefix+strconv.FormatInt(id, 10))
	}
	if cap(w.buf) < n*bs {
		w.buf = make([]byte, n*bs)
	}
	w.blocks = w.blocks[:0]
	for j := range n {
		w.blocks = append(w.blocks, w.buf[j*bs:(j+1)*bs])
	}
	if cap(w.readable) < n {
		w.readable = make([]bool, n)
	}
	w.readable = w.readable[:n]
	clear(w.readable)

	// The stored prefix.
	t := time.Now()
	exist, err := rp.store.BatchExist(ctx, w.keys)
	res.ExistLatency = time.Since(t)
	if err == nil && len(exist) != n {
		err = fmt.Errorf("%d answers for %d keys", len(exist), n)
	}
	if err != nil {
		// Nothing is known to be stored: the prefill computes it all.
		res.ExistFailed = true
		res.Err = fmt.Sprintf("exist: %v", err)
		exist = nil
	}
	for res.ExistBlocks < len(exist) && exist[res.ExistBlocks] {
		res.ExistBlocks++
	}
	for j := res.ExistBlocks; j < len(exist); j++ {
		// Stored past a gap (an evicted block): useless to this prefill,
		// but there is no need to write it again.
		w.readable[j] = exist[j]
	}

	// Read it; the first block missing or wrong ends the usable prefix.
	res.HitBlocks = res.ExistBlocks
	if p := res.ExistBlocks; p > 0 {
		t := time.Now()
		errs := rp.store.BatchGet(ctx, w.keys[:p], w.blocks[:p])
		res.GetLatency = time.Since(t)
		for j := range p {
			var err error
			if len(errs) != p {
				err = fmt.Errorf("%d answers for %d keys", len(errs), p)
			} else {
				err = errs[j]
			}
			if err != nil {
				res.FailedGets++
				res.HitBlocks = min(res.HitBlocks, j)
				note(res, fmt.Sprintf("get %s: %v", w.keys[j], err))
				continue
			}
			res.BytesRead += int64(bs)
			if off := verify(req.HashIDs[j], w.blocks[j]); off >= 0 {
				res.Corrupt++
				res.HitBlocks = min(res.HitBlocks, j)
				msg := fmt.Sprintf("get %s: byte %d of %d differs from what was put", w.keys[j], off, bs)
				if res.Corrupt == 1 {
					res.Err = msg
				}
				continue
			}
			w.readable[j] = true
		}
	}

	// Store what the prefill computed and the store lacks.
	w.putKeys, w.putVals = w.putKeys[:0], w.putVals[:0]
	for j := res.HitBlocks; j < n; j++ {
		if !w.readable[j] {
			fill(req.HashIDs[j], w.blocks[j])
			w.putKeys = append(w.putKeys, w.keys[j])
			w.putVals = append(w.putVals, w.blocks[j])
		}
	}
	if k := len(w.putKeys); k > 0 {
		res.PutBlocks = k
		t := time.Now()
		errs := rp.store.BatchPut(ctx, w.putKeys, w.putVals)
		res.PutLatency = time.Since(t)
		for j := range k {
			var err error
			if len(errs) != k {
				err = fmt.Errorf("%d answers for %d keys", len(errs), k)
			} else {
				err = errs[j]
			}
			if err != nil {
				res.FailedPuts++
				note(res, fmt.Sprintf("put %s: %v", w.putKeys[j], err))
				continue
			}
			res.BytesWritten += int64(bs)
		}
	}

	c := &rp.counts
	c.blocks.Add(int64(n))
	c.hits.Add(int64(res.HitBlocks))
	c.bound.Add(int64(res.InfiniteHitBlocks))
	c.bytes.Add(res.BytesRead + res.BytesWritten)
	if res.Err != "" {
		c.errors.Add(1)
	}
	c.done.Add(1)
}

// note keeps msg as the request's error unless it has one.
func note(res *RequestResult, msg string) {
	if res.Err == "" {
		res.Err = msg
	}
}

// summarize sums the first n results.
func (rp *replay) summarize(n int, wall time.Duration) *Result {
	o := rp.opts
	r := &Result{Requests: n, BlockBytes: o.BlockBytes, Concurrency: o.Concurrency, Speedup: o.Speedup,
		KeyPrefix: o.KeyPrefix, PerRequest: rp.results[:n], Seconds: wall.Seconds()}
	var gets, puts []time.Duration
	for _, q := range r.PerRequest {
		r.Blocks += int64(q.InputBlocks)
		r.HitBlocks += int64(q.HitBlocks)
		r.InfiniteHitBlocks += int64(q.InfiniteHitBlocks)
		r.PutBlocks += int64(q.PutBlocks)
		r.BytesRead += q.BytesRead
		r.BytesWritten += q.BytesWritten
		r.Corrupt += q.Corrupt
		r.FailedGets += q.FailedGets
		r.FailedPuts += q.FailedPuts
		if q.ExistBlocks > 0 {
			gets = append(gets, q.GetLatency)
		}
		if q.PutBlocks > 0 {
			puts = append(puts, q.PutLatency)
		}
		if q.ExistFailed {
			r.FailedExists++
		}
		r.MaxLag = max(r.MaxLag, q.Lag)
	}
	r.Gets, r.Puts = len(gets), len(puts)
	if r.Blocks > 0 {
		r.HitRatio = float64(r.HitBlocks) / float64(r.Blocks)
		r.InfiniteHitRatio = float64(r.InfiniteHitBlocks) / float64(r.Blocks)
	}
	r.GB = float64(r.BytesRead+r.BytesWritten) / 1e9
	if r.Seconds > 0 {
		r.GBPerS = r.GB / r.Seconds
	}
	r.GetP50, r.GetP99 = hist.NearestRank(gets, 0.5), hist.NearestRank(gets, 0.99)
	r.PutP50, r.PutP99 = hist.NearestRank(puts, 0.5), hist.NearestRank(puts, 0.99)
	return r
}
