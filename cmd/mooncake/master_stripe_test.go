package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
)

// `mooncake master --stripe_min_size --stripe_count` stripes the values at
// least that large over that many segments; values below stay whole, and
// values that are not a size or a count stop the master with an error
// that names the flag.
func TestMasterStripeFlags(t *testing.T) {
	cmd := selfCommand(t, "master", "--rpc_address", "127.0.0.1", "--rpc_port", "0", "--metrics_port", "-1",
		"--stripe_min_size", "1MiB", "--stripe_count", "3")
	line := startProc(t, cmd, "master listening ")
	rpc := regexp.MustCompile(`rpc=(\S+)`).FindStringSubmatch(line)
	require.NotNil(t, rpc, line)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var clients []*client.Client
	for range 3 {
		c, err := client.New(ctx, client.Config{Master: rpc[1], SegmentSize: 16 << 20, LocalBufferSize: 16 << 20,
			EngineConfig: engine.Config{Host: "127.0.0.1", Transport: "tcp"}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	big, small := payload("big", 3<<20+17), payload("small", 1<<20-1)
	require.NoError(t, clients[0].Put(ctx, "big", big, nil))
	require.NoError(t, clients[0].Put(ctx, "small", small, nil))
	reps, errs := clients[1].BatchReplicas(ctx, []string{"big", "small"})
	require.NoError(t, errors.Join(errs...))
	assert.Len(t, reps[0][0].GetMemory().GetStripes(), 3, "over --stripe_min_size: --stripe_count pieces")
	assert.Empty(t, reps[1][0].GetMemory().GetStripes(), "under --stripe_min_size: whole")
	got, err := clients[2].Get(ctx, "big")
	require.NoError(t, err)
	assert.True(t, bytes.Equal(big, got))
	for _, c := range clients {
		require.NoError(t, c.Close())
	}
	stopOnSIGTERM(t, cmd, "master")

	for _, bad := range []struct{ flag, value, want string }{
		{"--stripe_count", "0", "--stripe_count 0: want at least 1"},
		{"--stripe_count", "65", "StripeCount 65 is over 64"},
		{"--stripe_min_size", "lots", "stripe_min_size"},
	} {
		c := selfCommand(t, "master", "--rpc_address", "127.0.0.1", "--rpc_port", "0", "--metrics_port", "-1",
			bad.flag, bad.value)
		c.Stderr = nil
		out, err := c.CombinedOutput()
		require.Error(t, err, "%s %s", bad.flag, bad.value)
		assert.Contains(t, string(out), bad.want)
	}
}
