package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
)

// TestMemoryLocation: registered memory is reported where registration
// found it (host, or the GPU the driver named), a range must lie inside
// one region, and unregistered memory is not known.
func TestMemoryLocation(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, engine.Config{Transport: "tcp"})
	host := anonMem(t, 1<<16)
	g1 := gpuMem(t, 1, 1<<20)
	require.NoError(t, e.RegisterMemory(ctx, addr(host), 1<<16, "cpu:0", false))
	// Registered as "*": found on the GPU by asking the driver.
	require.NoError(t, e.RegisterMemory(ctx, g1, 1<<20, "*", false))

	cases := []struct {
		name     string
		addr     uintptr
		n        uint64
		dev      int
		onDevice bool
		ok       bool
	}{
		{"host", addr(host) + 100, 200, -1, false, true},
		{"gpu", g1 + 4096, 1 << 16, 1, true, true},
		{"gpu, whole", g1, 1 << 20, 1, true, true},
		{"past the GPU region", g1 + 4096, 1 << 20, -1, false, false},
		{"unregistered", addr(anonMem(t, 4096)), 10, -1, false, false},
	}
	for _, tc := range cases {
		dev, on, ok := e.MemoryLocation(tc.addr, tc.n)
		assert.Equal(t, []any{tc.dev, tc.onDevice, tc.ok}, []any{dev, on, ok}, tc.name)
	}
	require.NoError(t, e.UnregisterMemory(ctx, g1))
	_, _, ok := e.MemoryLocation(g1, 1)
	assert.False(t, ok, "unregistered GPU memory")
}
