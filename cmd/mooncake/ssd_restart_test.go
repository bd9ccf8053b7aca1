package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// A storage node process with an SSD tier is killed (-9) after its objects
// reached the tier; the master expires it and its objects leave the pool.
// The node started again on the same --ssd_dir brings them back: every one
// reads back byte-exact.
func TestNodeKilledKeepsItsSSDTier(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0",
		Service: master.ServiceConfig{ClientTTL: 2 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	dir := t.TempDir()
	node := func() *exec.Cmd {
		cmd := selfCommand(t, "node", "--master", m.Addr(), "--global_segment_size", "8MiB",
			"--local_hostname", "127.0.0.1", "--transport", "tcp", "--ssd_dir", dir, "--ssd_size", "32MiB")
		startProc(t, cmd, "node ready segment=")
		return cmd
	}
	first := node()
	c := pureClient(t, m.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n, size = 10, 256 << 10
	for i := range n {
		key := fmt.Sprintf("ssd-%d", i)
		require.NoError(t, c.Put(ctx, key, payload(key, size), nil))
	}
	require.Eventually(t, func() bool { return m.Service().Stats().Offloaded >= n }, 20*time.Second, 10*time.Millisecond)

	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	require.Eventually(t, func() bool {
		_, err := c.Get(ctx, "ssd-0")
		return errors.Is(err, storepb.ErrObjectNotFound)
	}, 20*time.Second, 50*time.Millisecond, "the dead node's objects leave the pool")

	node()
	for i := range n {
		key := fmt.Sprintf("ssd-%d", i)
		got, err := c.Get(ctx, key)
		require.NoError(t, err, key)
		require.True(t, bytes.Equal(payload(key, size), got), key)
	}
}
