package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// `mooncake up` that cannot start fails cleanly: with one of its addresses
// held by another listening socket, or a failure at a later step (a node
// that cannot allocate its segment, in this process or as a child), it
// exits non-zero with an error that names the address or the step, does
// not panic, and leaves nothing behind: the etcd data directory it made in
// TMPDIR is gone and the processes it started are stopped.
func TestUpFailsCleanly(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	addr := held.Addr().String()
	port := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
	// What the machine cannot give: more than the address space.
	const tooBig = "1048576GiB"

	cases := []struct {
		name string
		args []string // replacing the defaults below
		want string
	}{
		{"etcd client port held", []string{"--etcd", addr}, "up: etcd client address " + addr + " in use"},
		{"master rpc port held, after etcd started", []string{"--rpc_port", port}, "up: master rpc address " + addr + " in use"},
		{"metrics port held, after etcd started", []string{"--metrics_port", port}, "up: master metrics address " + addr + " in use"},
		{"master rpc port held without HA", []string{"--no-ha", "--rpc_port", port}, "up: master rpc address " + addr + " in use"},
		{"node fails after etcd and master started", []string{"--global_segment_size", tooBig}, "up: cluster: node 0: client: segment of"},
		{"node process exits before ready", []string{"--node-processes", "--global_segment_size", tooBig},
			"up: cluster: node 0: process"},
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
			cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
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
		})
	}
}
