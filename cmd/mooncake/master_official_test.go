package main

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/mooncake-go/mooncake/internal/nettest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The official command line of the loopback recipe, with an official flag
// that has no effect here and one set in the config file: the master
// starts, serves the HTTP metadata API in its own process, warns of the
// two flags by name (and of no other), and stops cleanly.
func TestMasterOfficialCommandLine(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "master.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"eviction_high_watermark_ratio": 0.95, "cxl_size": 1024}`), 0o600))
	cmd := selfCommand(t, "master", "--rpc_port=0", "--metrics_port=0",
		"--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
		"--http_metadata_server_port=0", "--default_kv_lease_ttl=500",
		"--memory_allocator=offset", "--v=1", "--config_path", cfg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	line := startProc(t, cmd, "master listening ")
	url := regexp.MustCompile(`metadata=(\S+)`).FindStringSubmatch(line)
	require.NotNil(t, url, "the startup line names the metadata URL: %s", line)
	require.True(t, strings.HasPrefix(url[1], "http://127.0.0.1:"), url[1])

	req, _ := http.NewRequest(http.MethodPut, url[1]+"?key=mooncake/ram/seg", strings.NewReader(`{"name":"seg"}`))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get(url[1] + "?key=mooncake/ram/seg")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, `{"name":"seg"}`, string(body))

	stopOnSIGTERM(t, cmd, "master")
	log := stderr.String()
	for _, flag := range []string{"--memory_allocator", "--v", "--cxl_size"} {
		assert.Contains(t, log, "flag="+flag+" ", "a warning names %s", flag)
	}
	assert.Equal(t, 3, strings.Count(log, "has no effect here"), "no warning for a flag not given:\n%s", log)
	// The metadata server stopped with the master: its port is free.
	_, err = http.Get(url[1] + "?key=mooncake/ram/seg")
	assert.Error(t, err)
}

// --port is the deprecated name of --rpc_port: given alone it sets the
// gRPC port; beside --rpc_port it loses.
func TestMasterDeprecatedPort(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  func(port int) []string
		equal bool // the master listens on port
	}{
		// --port alone moves the gRPC port, as Mooncake's.
		{"port alone", func(p int) []string { return []string{"--port", strconv.Itoa(p)} }, true},
		// --rpc_port wins over --port.
		{"rpc_port wins", func(p int) []string { return []string{"--port", strconv.Itoa(p), "--rpc_port", "0"} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePort(t)
			cmd := selfCommand(t, append([]string{"master", "--metrics_port=0", "--rpc_address", "127.0.0.1"}, tc.args(port)...)...)
			line := startProc(t, cmd, "master listening ")
			rpc := regexp.MustCompile(`rpc=(\S+)`).FindStringSubmatch(line)
			require.NotNil(t, rpc, line)
			if tc.equal {
				assert.Equal(t, "127.0.0.1:"+strconv.Itoa(port), rpc[1])
			} else {
				assert.NotEqual(t, "127.0.0.1:"+strconv.Itoa(port), rpc[1])
			}
			stopOnSIGTERM(t, cmd, "master")
		})
	}
}

// A flag that no official binary has is still an error, and so is an HA
// backend other than etcd.
func TestMasterRefusesUnknownFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Not an official flag: pflag's own error.
		{[]string{"--no_such_flag=1"}, "unknown flag: --no_such_flag"},
		// Official, but a backend we do not have.
		{[]string{"--ha_backend_type=redis", "--rpc_port=0", "--metrics_port=-1"}, `--ha_backend_type "redis"`},
	} {
		cmd := selfCommand(t, append([]string{"master"}, tc.args...)...)
		cmd.Stderr = nil
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%v exits non-zero: %s", tc.args, out)
		assert.Contains(t, string(out), tc.want)
	}
}

// Every flag official mooncake_master's --help lists is accepted by ours
// (where the official wheel is installed, as scripts/test-deps.sh does).
func TestMasterAcceptsEveryOfficialFlag(t *testing.T) {
	names := officialHelpFlags(t, "mooncake_master")
	fs := newMasterCmd().Flags()
	for _, n := range names {
		assert.NotNil(t, fs.Lookup(n), "official flag --%s", n)
	}
}

// officialHelpFlags are the flags the official binary's --help lists, but
// gflags' own help and completion flags (which no deployment sets).
func officialHelpFlags(t *testing.T, binary string) []string {
	t.Helper()
	exe := filepath.Join("..", "..", ".venv-official", "bin", binary)
	if _, err := os.Stat(exe); err != nil {
		t.Skipf("official %s not installed (scripts/test-deps.sh installs .venv-official)", binary)
	}
	out, _ := exec.Command(exe, "--help").CombinedOutput() // gflags' --help exits 1
	var names []string
	skip := false
	flag := regexp.MustCompile(`^    -(\w+) `)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "  Flags from ") {
			skip = strings.Contains(l, "gflags_reporting") || strings.Contains(l, "gflags_completions")
			continue
		}
		if m := flag.FindStringSubmatch(l); m != nil && !skip {
			names = append(names, m[1])
		}
	}
	require.Greater(t, len(names), 15, "parsed the flags of %s --help:\n%s", binary, out)
	return names
}

// freePort is a TCP port nothing listens on just now, outside the range
// the kernel hands out on its own.
func freePort(t *testing.T) int {
	t.Helper()
	return nettest.FreePort(t)
}
