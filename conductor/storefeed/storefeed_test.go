package storefeed_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/storefeed"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// call is one Sink call.
type call struct {
	added  bool
	blocks []uint64
}

// recorder is a Scheduler's Sink that records the calls and signals each.
type recorder struct {
	s      *conductor.Scheduler
	mu     sync.Mutex
	calls  []call
	signal chan struct{}
}

func (r *recorder) StoreAdded(blocks []uint64)   { r.record(true, blocks) }
func (r *recorder) StoreEvicted(blocks []uint64) { r.record(false, blocks) }

func (r *recorder) record(added bool, blocks []uint64) {
	if added {
		r.s.StoreAdded(blocks)
	} else {
		r.s.StoreEvicted(blocks)
	}
	r.mu.Lock()
	b := slices.Clone(blocks)
	slices.Sort(b)
	r.calls = append(r.calls, call{added, b})
	r.mu.Unlock()
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

// await waits until the sink has had n calls, and returns them.
func (r *recorder) await(t *testing.T, n int) []call {
	t.Helper()
	r.until(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.calls) >= n
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// until waits for cond, checking it after every sink call.
func (r *recorder) until(t *testing.T, cond func() bool) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-r.signal:
		case <-timeout:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("condition not met; sink calls %v", r.calls)
		}
	}
}

// startMaster starts a master on addr with a segment to put into.
func startMaster(t *testing.T, addr string) *master.Server {
	t.Helper()
	m, err := master.Start(master.ServerConfig{Listen: addr,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, m.Service().MountSegment(t.Context(), "c1", &storepb.Segment{Id: "s1", Name: "node-1", Base: 1 << 32,
		Size: 1 << 20, TransportEndpoint: "127.0.0.1:1", Protocol: "tcp"}))
	return m
}

func put(t *testing.T, m *master.Server, keys ...string) {
	t.Helper()
	for _, k := range keys {
		_, err := m.Service().PutStart(t.Context(), "c1", k, 64, nil)
		require.NoError(t, err)
		require.NoError(t, m.Service().PutEnd(t.Context(), "c1", k, 0))
	}
}

func TestFeed(t *testing.T) {
	defer goleak.VerifyNone(t)
	const h1, h2, h3, h4 = 0x11, 0x22, 0x33, 0x44
	m := startMaster(t, "127.0.0.1:0")
	addr := m.Addr()
	// Before the feed starts: block h1 under two ranks' keys, h2, a trace
	// replay's key and a key that is not a block.
	put(t, m, conductor.BlockKey("m@0", h1), conductor.BlockKey("m@1", h1), conductor.BlockKey("m@0", h2),
		"blk-7", "config.json")

	s, err := conductor.New(conductor.Config{})
	require.NoError(t, err)
	r := &recorder{s: s, signal: make(chan struct{}, 1)}
	f, err := storefeed.New(storefeed.Config{Masters: []string{addr}, Retry: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, r)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- f.Run(ctx) }()

	// The snapshot: three blocks.
	assert.Equal(t, []call{{true, []uint64{7, h1, h2}}}, r.await(t, 1))
	assert.Equal(t, storefeed.Stats{Keys: 4, Blocks: 3, Syncs: 1}, f.Stats())
	assert.Equal(t, map[string]int{conductor.StoreHolder: 2}, s.Longest([]uint64{h1, h2, h3}))

	// Then the changes. A block goes when its last key goes: removing
	// rank 0's key of h1 changes nothing, rank 1's evicts it.
	put(t, m, conductor.BlockKey("m@0", h3))
	assert.Equal(t, call{true, []uint64{h3}}, r.await(t, 2)[1])
	assert.Equal(t, map[string]int{conductor.StoreHolder: 3}, s.Longest([]uint64{h1, h2, h3}))
	require.NoError(t, m.Service().Remove(t.Context(), conductor.BlockKey("m@0", h1), true))
	require.NoError(t, m.Service().Remove(t.Context(), "config.json", true))
	require.NoError(t, m.Service().Remove(t.Context(), conductor.BlockKey("m@1", h1), true))
	calls := r.await(t, 3)
	assert.Equal(t, []call{{false, []uint64{h1}}}, calls[2:])
	assert.Empty(t, s.Longest([]uint64{h1, h2, h3}))
	assert.Equal(t, map[string]int{conductor.StoreHolder: 2}, s.Longest([]uint64{h2, h3}))

	// The master restarts, empty, on the same address; blocks h2 and h4
	// are put again. The feed watches again and reconciles: 7 and h3
	// lost, h4 gained (h2 too, if the new snapshot came before its put).
	require.NoError(t, m.Close())
	m = startMaster(t, addr)
	defer m.Close()
	put(t, m, conductor.BlockKey("m@0", h2), conductor.BlockKey("m@0", h4))
	// The feed counts a change before it tells the sink: wait for both.
	r.until(t, func() bool {
		return f.Stats() == storefeed.Stats{Keys: 2, Blocks: 2, Syncs: 2} &&
			len(s.Longest([]uint64{7})) == 0 && s.Longest([]uint64{h2, h3})[conductor.StoreHolder] == 1 &&
			s.Longest([]uint64{h4})[conductor.StoreHolder] == 1
	})

	cancel()
	require.NoError(t, <-ran)
}

func TestFeedConfig(t *testing.T) {
	s, err := conductor.New(conductor.Config{})
	require.NoError(t, err)
	_, err = storefeed.New(storefeed.Config{}, s)
	assert.ErrorIs(t, err, storefeed.ErrInvalid)
	_, err = storefeed.New(storefeed.Config{Masters: []string{"x:1"}}, nil)
	assert.ErrorIs(t, err, storefeed.ErrInvalid)
	_, err = storefeed.New(storefeed.Config{Masters: []string{"x:1"}, Retry: -1}, s)
	assert.ErrorIs(t, err, storefeed.ErrInvalid)
}
