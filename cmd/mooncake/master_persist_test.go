package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// A master without HA, with --enable_snapshot, is killed (-9) twice during
// a put load and restarted on its directory: every put it acknowledged
// reads back byte-exact from the restarted master, including those of the
// restarts before, and the load carries on across each restart.
func TestMasterKilledRestartsWithItsState(t *testing.T) {
	dir := t.TempDir()
	port := strconv.Itoa(freePort(t))
	var procs []*exec.Cmd
	start := func() {
		// A small interval so that snapshots and the journal after one are
		// both replayed.
		cmd := selfCommand(t, "master", "--rpc_address", "127.0.0.1", "--rpc_port", port, "--metrics_port", "-1",
			"--enable_snapshot", "--snapshot_backup_dir", dir, "--snapshot_interval_seconds", "1")
		startProc(t, cmd, "master listening rpc=")
		procs = append(procs, cmd)
	}
	start()
	addr := "127.0.0.1:" + port
	nodeClient(t, client.Config{Master: addr, SegmentSize: 128 << 20, RPCTimeout: 20 * time.Second})
	c := pureClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const size = 4 << 10
	var (
		mu    sync.Mutex
		acked []string
		wg    sync.WaitGroup
		stop  = make(chan struct{})
	)
	for g := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("P%d-%d", g, i)
				if err := c.Put(ctx, key, payload(key, size), nil); err == nil {
					mu.Lock()
					acked = append(acked, key)
					mu.Unlock()
				}
			}
		})
	}
	waitAcked := func(n int) {
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(acked) >= n
		}, time.Minute, 5*time.Millisecond)
	}
	for round := range 2 {
		waitAcked(200 * (round + 1))
		mu.Lock()
		before := len(acked)
		mu.Unlock()
		p := procs[len(procs)-1]
		require.NoError(t, p.Process.Signal(syscall.SIGKILL))
		_ = p.Wait()
		start()
		waitAcked(before + 50) // puts go on against the restarted master
	}
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d puts acknowledged across two kill -9 restarts of the master", len(acked))
	vals, errs := c.BatchGet(ctx, acked)
	for i, k := range acked {
		require.NoError(t, errs[i], k)
		require.True(t, bytes.Equal(payload(k, size), vals[i]), k)
	}
	ok, errs := c.BatchExist(ctx, acked)
	for i, k := range acked {
		require.NoError(t, errs[i], k)
		assert.True(t, ok[i], k)
	}
}

// A master without a journal is killed and started again: the node that
// outlives it mounts its segment again (told to), and the new master keeps
// new replicas off it for --remount_hold_sec, saying so in the puts it
// refuses; --remount_hold_sec 0 lets them in at once.
func TestMasterRestartHoldsRemountedSegment(t *testing.T) {
	for _, hold := range []string{"2", "0"} {
		t.Run("hold="+hold, func(t *testing.T) {
			port := strconv.Itoa(freePort(t))
			var proc *exec.Cmd
			start := func() {
				proc = selfCommand(t, "master", "--rpc_address", "127.0.0.1", "--rpc_port", port, "--metrics_port", "-1",
					"--remount_hold_sec", hold)
				startProc(t, proc, "master listening rpc=")
			}
			start()
			addr := "127.0.0.1:" + port
			nodeClient(t, client.Config{Master: addr, SegmentSize: 32 << 20, PingInterval: 100 * time.Millisecond})
			c := pureClient(t, addr)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			require.NoError(t, c.Put(ctx, "before", payload("before", 4096), nil), "a first mount is not held")

			require.NoError(t, proc.Process.Signal(syscall.SIGKILL))
			_ = proc.Wait()
			start()
			var heldSince time.Time
			for i := 0; ; i++ {
				err := c.Put(ctx, "after", payload("after", 4096), nil)
				if err == nil {
					break
				}
				require.ErrorIs(t, err, storepb.ErrNoAvailableHandle, "put %d after the restart", i)
				if strings.Contains(err.Error(), "held") && heldSince.IsZero() {
					heldSince = time.Now()
				}
				time.Sleep(20 * time.Millisecond)
			}
			if hold == "0" {
				assert.True(t, heldSince.IsZero(), "a put was refused for a hold turned off")
				return
			}
			require.False(t, heldSince.IsZero(), "no put was refused for the hold")
			assert.Greater(t, time.Since(heldSince), time.Second, "the hold ended early")
		})
	}
}

// nodeClient is a client holding a segment in this process, as a storage
// node, on loopback with 16 MiB of staging; closed when the test ends.
func nodeClient(t *testing.T, cfg client.Config) *client.Client {
	t.Helper()
	cfg.LocalBufferSize = 16 << 20
	cfg.EngineConfig.Host = "127.0.0.1"
	c, err := client.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
