package trace_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/bench/trace"
)

// small keeps the tests fast: 4 KiB blocks, odd-sized on purpose in one
// case to check the payload's tail.
const small = 4 << 10

// checkSums checks what holds for any replay: the sums are those of the
// requests, the bytes those of the blocks, and nothing is hit that was
// not found.
func checkSums(t *testing.T, res *trace.Result) {
	t.Helper()
	var blocks, hits, bound, puts, read, written int64
	for i, r := range res.PerRequest {
		require.Equal(t, i, r.Index)
		require.LessOrEqual(t, r.HitBlocks, r.ExistBlocks, "request %d", i)
		require.LessOrEqual(t, r.ExistBlocks, r.InputBlocks, "request %d", i)
		require.LessOrEqual(t, r.InfiniteHitBlocks, r.InputBlocks, "request %d", i)
		blocks += int64(r.InputBlocks)
		hits += int64(r.HitBlocks)
		bound += int64(r.InfiniteHitBlocks)
		puts += int64(r.PutBlocks)
		read += r.BytesRead
		written += r.BytesWritten
		require.Equal(t, int64(r.PutBlocks-r.FailedPuts)*int64(res.BlockBytes), r.BytesWritten, "request %d", i)
	}
	assert.Equal(t, blocks, res.Blocks)
	assert.Equal(t, hits, res.HitBlocks)
	assert.Equal(t, bound, res.InfiniteHitBlocks)
	assert.Equal(t, puts, res.PutBlocks)
	assert.Equal(t, read, res.BytesRead)
	assert.Equal(t, written, res.BytesWritten)
	assert.InDelta(t, float64(hits)/float64(blocks), res.HitRatio, 1e-12)
	assert.InDelta(t, float64(bound)/float64(blocks), res.InfiniteHitRatio, 1e-12)
	assert.InDelta(t, float64(read+written)/1e9, res.GB, 1e-12)
	assert.InDelta(t, res.GB/res.Seconds, res.GBPerS, 1e-9)
	assert.LessOrEqual(t, res.GetP50, res.GetP99)
	assert.LessOrEqual(t, res.PutP50, res.PutP99)
}

func TestReplay(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		name     string
		capacity int // blocks the store keeps, 0 for all
		opts     trace.Options
		check    func(t *testing.T, res *trace.Result, s *memStore)
	}{
		// With room for everything and one request at a time, the store
		// hits exactly what the trace allows, request by request.
		{"infinite, serial", 0, trace.Options{MaxRequests: 1500, Concurrency: 1, BlockBytes: small},
			func(t *testing.T, res *trace.Result, s *memStore) {
				for _, r := range res.PerRequest {
					require.Equal(t, r.InfiniteHitBlocks, r.HitBlocks, "request %d", r.Index)
					require.Equal(t, r.InputBlocks-r.HitBlocks, r.PutBlocks, "request %d", r.Index)
				}
				assert.Equal(t, res.InfiniteHitRatio, res.HitRatio)
				assert.Greater(t, res.HitRatio, 0.2)
				assert.Equal(t, res.HitBlocks*small, res.BytesRead)
				// Each distinct block is written once.
				assert.Equal(t, int(res.PutBlocks), s.len())
				assert.Equal(t, int(res.PutBlocks), s.puts)
			}},
		// A store that holds a few requests' worth of blocks loses most
		// of the reuse.
		{"small store", 300, trace.Options{MaxRequests: 1500, Concurrency: 1, BlockBytes: small},
			func(t *testing.T, res *trace.Result, s *memStore) {
				assert.Less(t, res.HitRatio, res.InfiniteHitRatio)
				assert.Positive(t, res.HitRatio, "the shared first block stays hot")
				assert.Equal(t, 300, s.len())
			}},
		// Concurrent workers still account for every block; they may find
		// a little less than the bound, or a little more, not much.
		{"infinite, concurrent", 0, trace.Options{MaxRequests: 1500, Concurrency: 8, BlockBytes: small},
			func(t *testing.T, res *trace.Result, s *memStore) {
				assert.InDelta(t, res.InfiniteHitRatio, res.HitRatio, 0.05)
				assert.Equal(t, 8, res.Concurrency)
			}},
		// A block size that is no multiple of 8 bytes still verifies.
		{"odd block size", 0, trace.Options{MaxRequests: 300, Concurrency: 2, BlockBytes: 1001},
			func(t *testing.T, res *trace.Result, s *memStore) {
				assert.Zero(t, res.Corrupt)
				assert.Equal(t, res.HitBlocks*1001, res.BytesRead)
			}},
		// Defaults: 8 workers, 64 KiB, "blk-" keys.
		{"defaults", 0, trace.Options{MaxRequests: 50},
			func(t *testing.T, res *trace.Result, s *memStore) {
				assert.Equal(t, trace.DefaultBlockBytes, res.BlockBytes)
				assert.Equal(t, trace.DefaultConcurrency, res.Concurrency)
				assert.Equal(t, "blk-", res.KeyPrefix)
				s.mu.Lock()
				defer s.mu.Unlock()
				assert.Contains(t, s.byKey, "blk-0")
			}},
		// The prefix names the keys.
		{"key prefix", 0, trace.Options{MaxRequests: 5, KeyPrefix: "run7/", BlockBytes: small},
			func(t *testing.T, res *trace.Result, s *memStore) {
				s.mu.Lock()
				defer s.mu.Unlock()
				assert.Contains(t, s.byKey, "run7/0")
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMemStore(tc.capacity)
			res, err := trace.Replay(context.Background(), s, tc.opts)
			require.NoError(t, err)
			require.Equal(t, tc.opts.MaxRequests, res.Requests)
			require.Len(t, res.PerRequest, res.Requests)
			assert.Zero(t, res.Corrupt+res.FailedExists+res.FailedGets+res.FailedPuts)
			for _, r := range res.PerRequest {
				require.Empty(t, r.Err)
			}
			checkSums(t, res)
			tc.check(t, res, s)
		})
	}
}

func TestReplayFaults(t *testing.T) {
	defer goleak.VerifyNone(t)
	opts := trace.Options{MaxRequests: 200, Concurrency: 1, BlockBytes: small}
	// second is the key of a second block that a later request reuses.
	var second string
	seen := map[int64]bool{}
	for _, r := range trace.Conversation()[:opts.MaxRequests] {
		if len(r.HashIDs) > 1 && seen[r.HashIDs[1]] {
			second = "blk-" + strconv.FormatInt(r.HashIDs[1], 10)
			break
		}
		for _, id := range r.HashIDs {
			seen[id] = true
		}
	}
	require.NotEmpty(t, second)
	for _, tc := range []struct {
		name     string
		sabotage func(*memStore)
		check    func(t *testing.T, res *trace.Result, err error)
	}{
		// Block 0 starts most prompts; read back wrong, it is never a hit,
		// it fails the replay, and the error says where.
		{"corrupt", func(s *memStore) { s.corrupt = func(k string) bool { return k == "blk-0" } },
			func(t *testing.T, res *trace.Result, err error) {
				require.ErrorIs(t, err, trace.ErrCorrupt)
				assert.Positive(t, res.Corrupt)
				first := res.PerRequest[0]
				for _, r := range res.PerRequest {
					if r.Corrupt > 0 {
						first = r
						break
					}
				}
				assert.Contains(t, err.Error(), "request "+strconv.Itoa(first.Index)+": get blk-0: byte 2048 of 4096 differs")
				assert.Zero(t, res.HitBlocks, "nothing after a corrupt first block is usable")
				assert.Equal(t, res.Corrupt, count(res, func(r trace.RequestResult) int { return r.Corrupt }))
				// The prefill recomputes the block and writes it again.
				assert.Greater(t, res.PutBlocks, res.Blocks-res.InfiniteHitBlocks)
			}},
		// A corrupt block later in a prompt ends the prefix there.
		{"corrupt later", func(s *memStore) { s.corrupt = func(k string) bool { return k == second } },
			func(t *testing.T, res *trace.Result, err error) {
				require.ErrorIs(t, err, trace.ErrCorrupt)
				for _, r := range res.PerRequest {
					if r.Corrupt > 0 {
						assert.Equal(t, 1, r.HitBlocks, "request %d: block 0 only", r.Index)
					}
				}
			}},
		// A failed get is counted, ends the prefix and is no replay error.
		{"failed get", func(s *memStore) { s.failGet = func(k string) bool { return k == "blk-0" } },
			func(t *testing.T, res *trace.Result, err error) {
				require.NoError(t, err)
				assert.Positive(t, res.FailedGets)
				assert.Zero(t, res.HitBlocks)
				assert.Zero(t, res.Corrupt)
				assert.Equal(t, res.FailedGets, count(res, func(r trace.RequestResult) int { return r.FailedGets }))
				for _, r := range res.PerRequest {
					if r.FailedGets > 0 {
						assert.Contains(t, r.Err, "get blk-0: memstore: injected failure")
					}
				}
			}},
		// A failed lookup counts as an empty store: all is written.
		{"failed exist", func(s *memStore) { s.failExist = true },
			func(t *testing.T, res *trace.Result, err error) {
				require.NoError(t, err)
				assert.Equal(t, res.Requests, res.FailedExists)
				assert.Zero(t, res.HitBlocks)
				assert.Equal(t, res.Blocks, res.PutBlocks)
				assert.Zero(t, res.Gets)
				assert.Equal(t, "exist: memstore: injected failure", res.PerRequest[0].Err)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMemStore(0)
			tc.sabotage(s)
			res, err := trace.Replay(context.Background(), s, opts)
			require.NotNil(t, res)
			require.Equal(t, opts.MaxRequests, res.Requests)
			checkSums(t, res)
			tc.check(t, res, err)
		})
	}
}

func TestReplayValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts trace.Options
		want string
	}{
		{"negative max", trace.Options{MaxRequests: -1}, "trace: MaxRequests -1"},
		{"negative speedup", trace.Options{Speedup: -2}, "trace: Speedup -2"},
		{"infinite speedup", trace.Options{Speedup: 1 / zero()}, "trace: Speedup +Inf"},
		{"negative concurrency", trace.Options{Concurrency: -1}, "trace: Concurrency -1"},
		{"negative block", trace.Options{BlockBytes: -1}, "trace: BlockBytes -1"},
		{"negative progress", trace.Options{ProgressEvery: -time.Second}, "trace: ProgressEvery -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := trace.Replay(context.Background(), newMemStore(0), tc.opts)
			require.EqualError(t, err, tc.want)
		})
	}
	_, err := trace.Replay(context.Background(), nil, trace.Options{})
	require.EqualError(t, err, "trace: nil Store")
}

func TestReplaySpeedup(t *testing.T) {
	defer goleak.VerifyNone(t)
	// Requests at 0, 100 and 300 ms, ten times faster.
	reqs := []trace.Request{
		{Timestamp: 1000, HashIDs: []int64{1}},
		{Timestamp: 1100, HashIDs: []int64{1, 2}},
		{Timestamp: 1300, HashIDs: []int64{1, 2, 3}},
	}
	res, err := trace.Replay(context.Background(), newMemStore(0),
		trace.Options{Trace: reqs, Speedup: 10, BlockBytes: small})
	require.NoError(t, err)
	for i, want := range []time.Duration{0, 10 * time.Millisecond, 30 * time.Millisecond} {
		assert.GreaterOrEqual(t, res.PerRequest[i].Start, want, "request %d", i)
	}
	assert.GreaterOrEqual(t, res.Seconds, 0.03)
	assert.Equal(t, []int{0, 1, 2}, []int{res.PerRequest[0].HitBlocks, res.PerRequest[1].HitBlocks,
		res.PerRequest[2].HitBlocks})
	var out strings.Builder
	require.NoError(t, res.WriteTable(&out))
	assert.Contains(t, out.String(), "trace time / 10")
	assert.Contains(t, out.String(), "max lag")
}

func TestReplayCanceled(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// An hour of trace at real time: only a cancellation ends it soon.
	res, err := trace.Replay(ctx, newMemStore(0), trace.Options{Speedup: 1, BlockBytes: small})
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "trace: replay stopped after")
	assert.Zero(t, res.Requests, "canceled before the first request")
	assert.Empty(t, res.PerRequest)
}

func TestProgressLines(t *testing.T) {
	defer goleak.VerifyNone(t)
	// A buffer is no terminal: plain lines, and a last one at the end.
	var out bytes.Buffer
	_, err := trace.Replay(context.Background(), newMemStore(0),
		trace.Options{MaxRequests: 400, Concurrency: 2, BlockBytes: small, Progress: &out,
			ProgressEvery: time.Millisecond})
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.NotEmpty(t, lines)
	for _, l := range lines {
		assert.True(t, strings.HasPrefix(l, "trace: "), l)
		assert.NotContains(t, l, "\r")
	}
	assert.Contains(t, lines[len(lines)-1], "400/400 requests (100%)")
}

func TestWriteTable(t *testing.T) {
	res, err := trace.Replay(context.Background(), newMemStore(0),
		trace.Options{MaxRequests: 300, Concurrency: 1, BlockBytes: small})
	require.NoError(t, err)
	var out strings.Builder
	require.NoError(t, res.WriteTable(&out))
	s := out.String()
	for _, want := range []string{
		"Trace replay: 300 requests, block 4 KiB (scaled down from 160 MiB), concurrency 1, as fast as possible",
		"hit blocks", "infinite-cache bound", "GB/s", "get latency", "corrupt blocks",
		"ratio hit / infinite bound = 1.000",
	} {
		assert.Contains(t, s, want)
	}
	assert.NotContains(t, s, "max lag", "no lag without a schedule")
}

func count(res *trace.Result, f func(trace.RequestResult) int) int {
	n := 0
	for _, r := range res.PerRequest {
		n += f(r)
	}
	return n
}

func zero() float64 { return 0 }

// cancelStore cancels the replay's context once it has put after blocks.
type cancelStore struct {
	*memStore
	after  int
	cancel context.CancelFunc
}

func (s *cancelStore) BatchPut(ctx context.Context, keys []string, values [][]byte) []error {
	errs := s.memStore.BatchPut(ctx, keys, values)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.puts >= s.after {
		s.cancel()
	}
	return errs
}

func TestReplayCanceledMidway(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &cancelStore{memStore: newMemStore(0), after: 500, cancel: cancel}
	res, err := trace.Replay(ctx, s, trace.Options{Concurrency: 4, BlockBytes: small})
	require.ErrorIs(t, err, context.Canceled)
	// The result covers the requests handed out, each of them complete.
	require.Positive(t, res.Requests)
	require.Less(t, res.Requests, trace.ConversationLines)
	require.Len(t, res.PerRequest, res.Requests)
	checkSums(t, res)
	assert.Equal(t, s.puts, int(res.PutBlocks))
}
