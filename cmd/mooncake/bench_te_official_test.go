package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The official bench's two processes, with its flag names: a target that
// publishes its buffer in an HTTP metadata server under
// --local_server_name, and an initiator that writes it by --segment_id for
// a --duration given in bare seconds. RDMA-only flags warn by name.
func TestBenchTEOfficialTwoProcesses(t *testing.T) {
	meta := selfCommand(t, "metadata", "--host", "127.0.0.1", "--port", "0")
	url := startProc(t, meta, "http://")

	target := selfCommand(t, "bench", "te", "--mode=target", "--protocol=tcp", "--metadata_server="+url,
		"--local_server_name=127.0.0.1:12345", "--buffer_size=8388608")
	line := startProc(t, target, "target ready ")
	assert.Contains(t, line, "segment=127.0.0.1:12345 ")
	assert.Contains(t, line, "length=8388608")

	init := selfCommand(t, "bench", "te", "--protocol=tcp", "--metadata_server="+url,
		"--local_server_name=127.0.0.1:12346", "--segment_id=127.0.0.1:12345", "--operation=write",
		"--threads=2", "--block_size=65536", "--batch_size=16", "--duration=1", "--buffer_size=4194304",
		"--repeat=1", "--device_name=mlx5_0", "--json")
	var stdout, stderr bytes.Buffer
	init.Stdout, init.Stderr = &stdout, &stderr
	require.NoError(t, init.Run(), "stderr:\n%s", stderr.String())
	var res struct {
		Transport string  `json:"transport"`
		Op        string  `json:"op"`
		Block     int     `json:"block_size"`
		Batch     int     `json:"batch_size"`
		Threads   int     `json:"threads"`
		Duration  float64 `json:"duration_s"`
		Target    string  `json:"target"`
		Bytes     uint64  `json:"bytes"`
		Yardstick string  `json:"yardstick_name"`
	}
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &res), stdout.String())
	assert.Equal(t, "tcp", res.Transport)
	assert.Equal(t, "write", res.Op)
	assert.Equal(t, []int{65536, 16, 2}, []int{res.Block, res.Batch, res.Threads})
	assert.Equal(t, 1.0, res.Duration, "--duration 1 is one second")
	assert.Equal(t, "external", res.Target)
	assert.Positive(t, res.Bytes)
	assert.Empty(t, res.Yardstick, "no yardstick against a remote target")
	assert.Contains(t, stderr.String(), "flag=--device_name ")
	stopOnSIGTERM(t, target, "bench te target")
}

// Bad values of the official flags are errors that name them, and so is a
// flag that no official bench has.
func TestBenchTEOfficialFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Neither of the official modes.
		{[]string{"--mode=server"}, `--mode "server"`},
		// Not a number of seconds nor a duration.
		{[]string{"--duration=ten"}, `invalid argument "ten" for "--duration"`},
		// No segment of that name in the (P2P) metadata: the lookup fails.
		{[]string{"--segment_id=127.0.0.1:1", "--duration=1"}, "--segment_id 127.0.0.1:1"},
		// Not an official flag.
		{[]string{"--no_such_bench_flag"}, "unknown flag: --no_such_bench_flag"},
	} {
		cmd := selfCommand(t, append([]string{"bench", "te"}, tc.args...)...)
		cmd.Stderr = nil
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%v: %s", tc.args, out)
		assert.True(t, strings.Contains(string(out), tc.want), "%v: %s", tc.args, out)
	}
}

// Every flag official transfer_engine_bench's --help lists is accepted.
func TestBenchTEAcceptsEveryOfficialFlag(t *testing.T) {
	fs := newBenchTECmd().Flags()
	for _, n := range officialHelpFlags(t, "transfer_engine_bench") {
		assert.NotNil(t, fs.Lookup(n), "official flag --%s", n)
	}
}
