package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/bench/store"
)

// The floors run from the command line: tcp with its server as a child
// process of the binary, memcpy in the parent; the ratios to them come out
// as JSON and as columns of the table, and no child outlives the run.
func TestBenchStoreFloors(t *testing.T) {
	bin := buildMooncake(t)
	t.Cleanup(func() {
		for _, pid := range processesOf(bin) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	run := func(args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"bench", "store", "--systems", "tcp,memcpy",
			"--clients", "2", "--duration", "200ms", "--warmup", "50ms", "--repeat", "1"}, args...)...)
		cmd.Env = append(os.Environ(), strings.TrimSpace("GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "stderr:\n%s", stderr.String())
		assert.Empty(t, processesOf(bin), "child processes left running")
		return stdout.String()
	}

	var rs []store.Result
	require.NoError(t, json.Unmarshal([]byte(run("--op", "get", "--value-size", "1MiB", "--json")), &rs))
	require.Len(t, rs, 2)
	tcp, mem := rs[0], rs[1]
	assert.Equal(t, []string{store.TCP, store.Remote}, []string{tcp.Name, tcp.Topology})
	assert.Equal(t, []string{store.Memcpy, store.SameHost}, []string{mem.Name, mem.Topology})
	for _, r := range rs {
		assert.Equal(t, store.OpGet, r.Op)
		assert.Equal(t, 1<<20, r.ValueSize)
		assert.Equal(t, 2, r.Clients)
		assert.Positive(t, r.Calls)
		assert.Positive(t, r.GBPerS)
	}
	assert.Equal(t, 1.0, tcp.XTCP)
	assert.Equal(t, 1.0, mem.XMemcpy)
	assert.InDelta(t, tcp.GBPerS/mem.GBPerS, tcp.XMemcpy, 1e-9)
	assert.InDelta(t, mem.GBPerS/tcp.GBPerS, mem.XTCP, 1e-9)

	table := strings.Split(strings.TrimSpace(run("--op", "put", "--value-size", "64KiB", "--batch-size", "4")), "\n")
	require.Len(t, table, 4, "title, header, two rows")
	assert.Regexp(t, ` x redis +x tcp +x memcpy$`, table[1])
	assert.Regexp(t, `^ +tcp +remote +put +64KiB +4 +2 .* - +1\.00 +\d+\.\d\d$`, table[2])
	assert.Regexp(t, `^ +memcpy +same-host +put +64KiB +4 +2 .* - +\d+\.\d\d +1\.00$`, table[3])
}

func TestBenchStoreRejectsUnknownSystem(t *testing.T) {
	root := newRoot()
	root.SetArgs([]string{"bench", "store", "--systems", "tcp,nfs"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	err := root.Execute()
	require.ErrorContains(t, err, `--systems: "nfs" is not one of ours, tcp, memcpy, redis, official`)
}
