package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestRunOfficial runs the official Mooncake Store yardstick, small, in
// both topologies. Without the wheel (`make deps`) it skips saying why.
func TestRunOfficial(t *testing.T) {
	defer goleak.VerifyNone(t)
	if _, _, err := officialPython(context.Background(), ""); err != nil {
		require.ErrorIs(t, err, ErrNoOfficial)
		t.Skipf("official yardstick: %v", err)
	}
	for _, tc := range []struct {
		name     string
		topology string
		o        Options
	}{
		// Every byte over loopback TCP to the storage process.
		{"remote get 1MiB", Remote, Options{Op: OpGet, ValueSize: 1 << 20, Clients: 2, Keys: 8}},
		{"remote put 4KiB x 128", Remote, Options{Op: OpPut, ValueSize: 4 << 10, BatchSize: 128}},
		// Each client reads its own segment.
		{"local get 4KiB x 16", Local, Options{Op: OpGet, ValueSize: 4 << 10, BatchSize: 16, Clients: 2, Keys: 64}},
		{"local put 64KiB", Local, Options{Op: OpPut, ValueSize: 64 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.Duration, o.Warmup = 300*time.Millisecond, 50*time.Millisecond
			res, err := RunOfficial(context.Background(), o, OfficialConfig{Topology: tc.topology})
			require.NoError(t, err)
			o = o.WithDefaults()
			assert.Equal(t, Official, res.Name)
			assert.Equal(t, tc.topology, res.Topology)
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

func TestRunOfficialErrors(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	_, err := RunOfficial(ctx, Options{}, OfficialConfig{Topology: "mesh"})
	require.ErrorContains(t, err, "store: OfficialConfig.Topology")
	_, err = RunOfficial(ctx, Options{Op: "scan"}, OfficialConfig{})
	require.ErrorContains(t, err, "store: Op")
	_, err = RunOfficial(ctx, Options{}, OfficialConfig{Python: "/nonexistent/python"})
	require.ErrorIs(t, err, ErrNoOfficial)
	assert.True(t, errors.Is(err, ErrNoOfficial))
}
