package store

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// testRedis starts a server for the test, or skips it saying why.
func testRedis(t *testing.T) *RedisServer {
	t.Helper()
	s, err := StartRedis(context.Background(), RedisConfig{})
	if errors.Is(err, ErrNoRedis) {
		t.Skipf("redis yardstick: %v", err)
	}
	require.NoError(t, err)
	return s
}

func TestRunRedis(t *testing.T) {
	defer goleak.VerifyNone(t)
	if _, err := StartRedis(context.Background(), RedisConfig{Path: "/nonexistent/redis-server"}); err == nil {
		t.Fatal("a missing redis-server started")
	}
	testRedis(t).Close() // skips without redis-server
	for _, tc := range []struct {
		name string
		o    Options
	}{
		// The shapes of the issue, small: one object per call, and batches.
		{"get 1MiB", Options{Op: OpGet, ValueSize: 1 << 20, Clients: 2, Keys: 8}},
		{"put 4KiB x 128", Options{Op: OpPut, ValueSize: 4 << 10, BatchSize: 128, Clients: 2}},
		{"get 4KiB x 128", Options{Op: OpGet, ValueSize: 4 << 10, BatchSize: 128, Clients: 2, Keys: 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.Duration, o.Warmup = 300*time.Millisecond, 50*time.Millisecond
			res, err := RunRedis(context.Background(), o, RedisConfig{})
			require.NoError(t, err)
			o = o.WithDefaults()
			assert.Equal(t, Redis, res.Name)
			assert.Equal(t, o.Op, res.Op)
			assert.Equal(t, o.Clients, res.Clients)
			assert.GreaterOrEqual(t, res.Seconds, 0.3)
			require.Positive(t, res.Calls)
			assert.Equal(t, res.Calls*uint64(o.BatchSize), res.Ops)
			assert.Positive(t, res.GBPerS)
			assert.Positive(t, res.P50us)
			assert.GreaterOrEqual(t, res.P99us, res.P50us)
			t.Logf("%s: %.0f ops/s, %.3f GB/s, p50 %.0f µs, p99 %.0f µs", tc.name, res.OpsPerS, res.GBPerS, res.P50us, res.P99us)
		})
	}
}

func TestRedisServer(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := testRedis(t)
	pid := s.PID()
	require.NoError(t, syscall.Kill(pid, 0), "server running")
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, s.Addr())

	o := Options{ValueSize: 100, BatchSize: 3}
	w, err := s.NewWorker(o)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, w.Put(ctx, []string{"a", "b", "c"}))
	require.NoError(t, w.Get(ctx, []string{"c", "b", "a"}))
	// A missing key fails the call by name.
	err = w.Get(ctx, []string{"a", "nope", "c"})
	require.ErrorIs(t, err, errNil)
	assert.Contains(t, err.Error(), "nope")
	// A value of another size fails too.
	small, err := s.NewWorker(Options{ValueSize: 10})
	require.NoError(t, err)
	require.NoError(t, small.Put(ctx, []string{"short"}))
	require.ErrorIs(t, w.Get(ctx, []string{"a", "short", "c"}), errBadSize)
	require.NoError(t, w.Get(ctx, []string{"a", "b", "c"}), "the connection stays usable")
	require.NoError(t, small.Close())

	// A cancelled call returns promptly with the context's error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, w.Get(cctx, []string{"a", "b", "c"}), context.Canceled)
	require.NoError(t, w.Close())

	require.NoError(t, s.Close())
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "server gone once Close returns")
	require.NoError(t, s.Close(), "Close is idempotent")
}
