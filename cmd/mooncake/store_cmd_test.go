package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// `mooncake up` starts a whole store that a client can use at the address
// it prints, and stops cleanly on SIGTERM. Its masters stripe as its flags
// say.
func TestUpCommand(t *testing.T) {
	cmd := selfCommand(t, "up", "--etcd", "127.0.0.1:0", "--rpc_port", "0", "--metrics_port", "0",
		"--global_segment_size", "64MiB", "--masters", "2", "--node-processes", "--nodes", "2",
		"--stripe_min_size", "1MiB", "--stripe_count", "2")
	line := startProc(t, cmd, "clients   --master ")
	url := strings.TrimPrefix(line, "clients   --master ")
	require.True(t, strings.HasPrefix(url, "etcd://127.0.0.1:"), url)

	c := pureClient(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := payload("up", 100<<10)
	require.NoError(t, c.Put(ctx, "up", want, nil))
	got, err := c.Get(ctx, "up")
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got))
	big := payload("striped", 3<<20)
	require.NoError(t, c.Put(ctx, "striped", big, nil))
	got, err = c.Get(ctx, "striped")
	require.NoError(t, err)
	require.True(t, bytes.Equal(big, got))
	reps, errs := c.BatchReplicas(ctx, []string{"up", "striped"})
	require.NoError(t, errors.Join(errs...))
	assert.Empty(t, reps[0][0].GetMemory().GetStripes(), "under --stripe_min_size")
	assert.Len(t, reps[1][0].GetMemory().GetStripes(), 2, "over --stripe_min_size: --stripe_count pieces")
	require.NoError(t, c.Close())

	stopOnSIGTERM(t, cmd, "up")
}

// The main job end to end, scaled down: the replay runs, verifies every
// block, and writes its table, Parquet file and plot.
func TestBenchTraceCommand(t *testing.T) {
	out := t.TempDir()
	cmd := selfCommand(t, "bench", "trace", "--max-requests", "60", "--block-size", "4KiB",
		"--global_segment_size", "64MiB", "--out", out)
	cmd.Stderr = nil
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	s := string(b)
	for _, want := range []string{"hit blocks", "infinite-cache bound", "corrupt blocks        0", "ratio hit / infinite bound"} {
		assert.Contains(t, s, want)
	}
	for _, f := range []string{"replay.parquet", "replay.png"} {
		st, err := os.Stat(filepath.Join(out, f))
		require.NoError(t, err)
		assert.Positive(t, st.Size())
	}
}

// The storage node processes of bench trace log at the command's
// --log-level, to nodes.log beside the results: stdout holds the table
// and nothing else, and no node's line reaches the terminal.
func TestBenchTraceNodeLogs(t *testing.T) {
	for _, tc := range []struct {
		level   string
		want    string // in nodes.log
		notWant string // in nodes.log
	}{
		// At info, the nodes' start-up lines are in the file.
		{"info", `level=INFO msg="node serving"`, ""},
		// At warn, the children were told so: none of their info lines.
		{"warn", "", "level=INFO"},
	} {
		t.Run(tc.level, func(t *testing.T) {
			out := t.TempDir()
			cmd := selfCommand(t, "bench", "trace", "--log-level", tc.level, "--nodes", "1", "--max-requests", "10",
				"--block-size", "4KiB", "--global_segment_size", "32MiB", "--out", out)
			cmd.Env = append(cmd.Env, "MC_LOG_LEVEL=") // the flag alone sets the level
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			require.NoError(t, cmd.Run(), "stderr:\n%s", stderr.String())

			logPath := filepath.Join(out, nodeLogName)
			assert.Contains(t, stdout.String(), "node logs: "+logPath)
			assert.Contains(t, stdout.String(), "corrupt blocks        0")
			assert.NotContains(t, stdout.String(), "level=", "no log line among the results")
			assert.NotContains(t, stderr.String(), "node serving", "the nodes' lines are in their file")
			logs, err := os.ReadFile(logPath)
			require.NoError(t, err)
			if tc.want != "" {
				assert.Contains(t, string(logs), tc.want)
			}
			if tc.notWant != "" {
				assert.NotContains(t, string(logs), tc.notWant)
				assert.NotContains(t, stderr.String(), tc.notWant, "nor this process's")
			}
		})
	}
}

// stopOnSIGTERM sends cmd SIGTERM and requires it to exit 0 within 20 s.
func stopOnSIGTERM(t *testing.T, cmd *exec.Cmd, name string) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "%s exits 0 on SIGTERM", name)
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not stop on SIGTERM", name)
	}
}
