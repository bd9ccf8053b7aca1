package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mooncake-go/mooncake/internal/nettest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// `mooncake up` that cannot start fails cleanly: with one of its addresses
// held by another listening socket, or a failure at a later step (a node
// that cannot allocate its segment, in this process or as a child), it
// exits non-zero with an error that names the address or the step, does
// not panic, and leaves nothing behind: the etcd data directory it made in
// TMPDIR is gone and the processes it started are stopped (and reaped)
// before it exits, a node that was ready when a later one failed included.
func TestUpFailsCleanly(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	addr := held.Addr().String()
	port := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	// A port free now, for the HTTP server of every node: the first node
	// takes it and gets ready, the second finds it taken and fails. It lies
	// outside the ephemeral range: a port freed from a bind to port 0 was
	// once given to the first node's engine before its HTTP server bound it.
	nodeHTTP := []string{"MOONCAKE_ENABLE_CLIENT_HTTP_SERVER=true",
		"MOONCAKE_CLIENT_HTTP_PORT=" + strconv.Itoa(nettest.FreePort(t))}
	// What the machine cannot give: more than the address space.
	const tooBig = "1048576GiB"

	cases := []struct {
		name string
		args []string // replacing the defaults below
		env  []string // for up and the nodes it starts
		want string
	}{
		{"etcd client port held", []string{"--etcd", addr}, nil, "up: etcd client address " + addr + " in use"},
		{"master rpc port held, after etcd started", []string{"--rpc_port", port}, nil, "up: master rpc address " + addr + " in use"},
		{"metrics port held, after etcd started", []string{"--metrics_port", port}, nil, "up: master metrics address " + addr + " in use"},
		{"master rpc port held without HA", []string{"--no-ha", "--rpc_port", port}, nil, "up: master rpc address " + addr + " in use"},
		{"node fails after etcd and master started", []string{"--global_segment_size", tooBig}, nil, "up: cluster: node 0: client: segment of"},
		{"node process exits before ready", []string{"--node-processes", "--global_segment_size", tooBig}, nil,
			"up: cluster: node 0: process"},
		{"second node process fails, the first one ready", []string{"--node-processes", "--nodes", "2"}, nodeHTTP,
			"up: cluster: node 1: process"},
		{"no pieces", []string{"--stripe_count", "0"}, nil, "--stripe_count 0: want at least 1"},
		{"a stripe size that is none", []string{"--stripe_min_size", "lots"}, nil, `--stripe_min_size "lots": want a size`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			args := map[string]string{"--etcd": "127.0.0.1:0", "--rpc_port": "0", "--metrics_port": "0",
				"--global_segment_size": "16MiB"}
			argv := []string{"up"}
			for i := 0; i < len(tc.args); i++ {
				if _, ok := args[tc.args[i]]; ok {
					args[tc.args[i]] = tc.args[i+1]
					i++
					continue
				}
				argv = append(argv, tc.args[i])
			}
			for f, v := range args {
				argv = append(argv, f, v)
			}
			cmd := selfCommand(t, argv...)
			cmd.Env = append(append(cmd.Env, "TMPDIR="+tmp), tc.env...)
			// Its own process group, which the nodes it starts inherit: what
			// is left of the group once it exited, it left behind.
			cmd.SysProcAttr.Setpgid = true
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cmd.WaitDelay = 10 * time.Second
			require.NoError(t, cmd.Start())
			timer := time.AfterFunc(90*time.Second, func() { _ = cmd.Process.Kill() })
			err := cmd.Wait()
			require.True(t, timer.Stop(), "mooncake up did not exit; stderr:\n%s", stderr.String())
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "mooncake up %v succeeded; stderr:\n%s", argv, stderr.String())
			assert.Equal(t, 1, exit.ExitCode())
			assert.Contains(t, stderr.String(), tc.want)
			assert.NotContains(t, stderr.String(), "panic")
			left, err := os.ReadDir(tmp)
			require.NoError(t, err)
			assert.Empty(t, left, "left in TMPDIR")
			assert.Empty(t, groupProcs(t, cmd.Process.Pid), "processes of mooncake up left")
		})
	}
}

// groupProcs returns "pid state" of each process in process group pgid,
// zombies included: a child its parent did not wait for is left behind too.
func groupProcs(t *testing.T, pgid int) []string {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	require.NoError(t, err)
	var out []string
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // it exited meanwhile
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) >= 3 && fields[2] == strconv.Itoa(pgid) {
			out = append(out, filepath.Base(filepath.Dir(f))+" "+fields[0])
		}
	}
	return out
}
