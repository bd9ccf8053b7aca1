package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildMooncake builds this command into a temporary directory, with the
// race detector when the test runs with it, so that the children are
// checked too and the build reuses the test's compiled packages.
func buildMooncake(t *testing.T) string {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build the binary:", err)
	}
	bin := filepath.Join(t.TempDir(), "mooncake")
	args := []string{"build", "-o", bin}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	out, err := exec.Command(gotool, append(args, ".")...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// processesOf lists the pids of running processes executing bin.
func processesOf(bin string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe")); err == nil && exe == bin {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestBenchTESeparateProcesses(t *testing.T) {
	bin := buildMooncake(t)
	// Whatever happens, no process of ours outlives the test.
	t.Cleanup(func() {
		for _, pid := range processesOf(bin) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	for _, tc := range []struct {
		name      string
		args      []string
		yardstick []string
		env       []string
	}{
		// Target and TCP sink are both child processes.
		{"tcp write", []string{"--transport", "tcp", "--op", "write"},
			[]string{"loopback-tcp-4conn", "loopback-tcp-1conn"}, nil},
		// The initiator maps the target child's memfd.
		{"shm read", []string{"--transport", "shm", "--op", "read"}, []string{"memcpy-1thread"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			args := append([]string{"bench", "te", "--duration", "300ms", "--repeat", "1", "--json",
				"--block-size", "64KiB", "--batch-size", "8"}, tc.args...)
			cmd := exec.CommandContext(ctx, bin, args...)
			// A race-enabled process sleeps a second on exit unless told
			// not to; the parent and both children would.
			cmd.Env = append(os.Environ(), append(tc.env,
				strings.TrimSpace("GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0"))...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			require.NoError(t, cmd.Run(), "stderr:\n%s", stderr.String())

			// Exactly one JSON object on stdout.
			dec := json.NewDecoder(&stdout)
			var res map[string]any
			require.NoError(t, dec.Decode(&res))
			assert.False(t, dec.More(), "more than one JSON value on stdout")
			for _, k := range []string{"transport", "op", "block_size", "batch_size", "threads", "seconds",
				"bytes", "gb_per_s", "p50_us", "p99_us", "yardstick_name", "yardstick_gb_per_s", "ratio", "runs"} {
				assert.Contains(t, res, k)
			}
			assert.Equal(t, tc.args[1], res["transport"])
			assert.Equal(t, tc.args[3], res["op"])
			assert.EqualValues(t, 64<<10, res["block_size"])
			assert.EqualValues(t, 8, res["batch_size"])
			assert.Equal(t, "process", res["target"])
			assert.Positive(t, res["bytes"])
			assert.Positive(t, res["gb_per_s"])
			assert.LessOrEqual(t, res["p50_us"], res["p99_us"])
			assert.Contains(t, tc.yardstick, res["yardstick_name"])
			assert.Positive(t, res["ratio"])
			assert.Len(t, res["runs"], 1+len(tc.yardstick))

			// The parent waited for its children: none is left.
			assert.Empty(t, processesOf(bin), "child processes left running")
		})
	}
}

// eventually polls cond every 10 ms until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

func TestBenchTEChildrenDieWithParent(t *testing.T) {
	bin := buildMooncake(t)
	t.Cleanup(func() {
		for _, pid := range processesOf(bin) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	cmd := exec.Command(bin, "bench", "te", "--duration", "1m", "--block-size", "64KiB", "--batch-size", "8")
	cmd.Env = append(os.Environ(), strings.TrimSpace("GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	require.NoError(t, cmd.Start())
	// The parent, the target and the TCP sink.
	require.True(t, eventually(20*time.Second, func() bool { return len(processesOf(bin)) == 3 }),
		"children never started: %v", processesOf(bin))
	// SIGKILL: the parent cleans nothing up; its children see stdin close.
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	assert.True(t, eventually(10*time.Second, func() bool { return len(processesOf(bin)) == 0 }),
		"children outlived their parent: %v", processesOf(bin))
}

func TestBenchTERejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown transport", []string{"--transport", "rdma"}, "--transport"},
		{"unknown op", []string{"--op", "copy"}, "--op"},
		{"unreadable size", []string{"--block-size", "3 parsecs"}, "size"},
		{"zero threads", []string{"--threads", "0"}, "positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot()
			root.SetArgs(append([]string{"bench", "te", "--in-process"}, tc.args...))
			root.SetOut(&bytes.Buffer{})
			root.SetErr(&bytes.Buffer{})
			err := root.Execute()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// bench te says up front how long it will measure (--repeat x the
// measurements x --duration), on stderr with its progress, and --json
// keeps stdout to the one JSON object.
func TestBenchTEPrintsItsPlan(t *testing.T) {
	root := newRoot()
	var stdout, stderr bytes.Buffer
	root.SetArgs([]string{"bench", "te", "--in-process", "--json", "--duration", "100ms", "--repeat", "2",
		"--block-size", "64KiB", "--batch-size", "8", "--lanes", "2"})
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	require.NoError(t, root.Execute(), "stderr:\n%s", stderr.String())

	first, _, _ := strings.Cut(stderr.String(), "\n")
	assert.Equal(t, "te: 2 run(s) x 3 measurement(s) (ours, loopback-tcp-2conn, loopback-tcp-1conn) x 100ms = 600ms of measuring, plus start-up",
		first)
	dec := json.NewDecoder(&stdout)
	var res map[string]any
	require.NoError(t, dec.Decode(&res), "stdout is JSON")
	assert.False(t, dec.More(), "more than one JSON value on stdout")
	assert.Len(t, res["runs"], 6)
}
