package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runChaosCLI runs `mooncake chaos args...` as a child (this test binary
// as the CLI, its masters and nodes its children) and returns its stdout
// and exit code.
func runChaosCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := selfCommand(t, append([]string{"chaos", "--log-level", "error"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.WaitDelay = 10 * time.Second
	require.NoError(t, cmd.Start())
	timer := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	err := cmd.Wait()
	require.True(t, timer.Stop(), "mooncake chaos did not end; stdout:\n%s", out.String())
	t.Logf("mooncake chaos %v:\n%s", args, out.String())
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	}
	require.NoError(t, err)
	return "", -1
}

// The soak under kill -9 of a storage node and of the leading master (each
// restarted a second later) finds no anomaly: no wrong bytes, no stale
// read, no acknowledged write lost. Its history lands in Parquet.
func TestChaosKillsFindNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.parquet")
	out, code := runChaosCLI(t, "--duration", "12s", "--clients", "3", "--keys", "16",
		"--faults", "kill-node@2s,kill-master@6s", "--out", path)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "anomalies: 0\n")
	// Both faults happened, and were healed.
	assert.Regexp(t, `kill-node +kill -9 node \d segment=\S+ pid=\d+; healed at`, out)
	assert.Regexp(t, `kill-master +kill -9 master \d \(leader\) rpc=\S+ pid=\d+; healed at`, out)
	// The workload got work done after the faults, and read every key at
	// the end.
	m := regexp.MustCompile(`(?m)^ +get +(\d+) +\d+ +\d+ +\d+ +(\d+) *$`).FindStringSubmatch(out)
	require.NotNil(t, m, "no get row in the table")
	gets, _ := strconv.Atoi(m[1])
	assert.Greater(t, gets, 100)
	final, _ := strconv.Atoi(m[2])
	assert.GreaterOrEqual(t, final, 16)
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Positive(t, st.Size())
}

// The control: objects removed behind the checker's back (lose-keys: a
// client outside the workload removes everything, unrecorded, and the
// master's watch reports removals, not evictions) are reported as lost
// acknowledged writes, and the run exits non-zero. Many keys and a late
// fault leave most of them unwritten again before the final reads.
func TestChaosCatchesLoss(t *testing.T) {
	out, code := runChaosCLI(t, "--duration", "5s", "--clients", "2", "--keys", "1024", "--value-size", "4KiB",
		"--faults", "lose-keys@4500ms", "--out", "")
	assert.Equal(t, 1, code)
	assert.Regexp(t, `lose-keys +removed [1-9]\d* objects behind the checker's back`, out)
	assert.Regexp(t, `anomalies: [1-9]\d* lost-write=[1-9]`, out)
	assert.Contains(t, out, "lost-write key=chaos-")
	// Lost, not corrupted: reads of the space the removal freed fail the
	// store's checksum instead of serving what was put there next.
	assert.NotContains(t, out, "wrong-bytes")
}
