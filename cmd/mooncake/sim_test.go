package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runSim runs `mooncake sim args...` in-process and returns its stdout.
func runSim(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"sim"}, args...))
	err := root.Execute()
	return out.String(), err
}

// --json prints the summary fields the issue names.
func TestSimJSON(t *testing.T) {
	out, err := runSim(t, "--max-requests", "300", "--json")
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	for _, k := range []string{"policy", "requests", "rejected", "cache_hit_ratio", "ttft_mean_s", "ttft_p90_s",
		"tbt_p90_ms", "effective_request_ratio", "replicas_max", "hot_block_replicas_mean"} {
		assert.Contains(t, v, k)
	}
	assert.Positive(t, v["replicas_max"])
	assert.GreaterOrEqual(t, v["hot_block_replicas_mean"], 1.0)
	assert.Equal(t, "global-cache-aware+reject", v["policy"])
	assert.EqualValues(t, 300, v["requests"])

	// Several runs: an array, one object per run.
	out, err = runSim(t, "--max-requests", "100", "--json", "--policy", "random, coupled", "--admission", "none")
	require.NoError(t, err)
	var vs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &vs), out)
	require.Len(t, vs, 2)
	assert.Equal(t, "random", vs[0]["policy"])
	assert.Equal(t, "coupled+prefix-cache", vs[1]["policy"], "the 3M-token local cache by default")
}

// Without --json: the table, a Parquet file per run and the plot.
func TestSimFiles(t *testing.T) {
	dir := t.TempDir()
	out, err := runSim(t, "--max-requests", "200", "--policy", "load-balance,coupled", "--out", dir)
	require.NoError(t, err)
	assert.Contains(t, out, "load-balance+reject")
	assert.Contains(t, out, "coupled")
	for _, name := range []string{"sim-load-balance+reject.parquet", "sim-coupled+prefix-cache.parquet"} {
		st, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Positive(t, st.Size())
	}
	for _, name := range []string{"sim.png", "sim-replicas.png"} {
		f, err := os.Open(filepath.Join(dir, name))
		require.NoError(t, err)
		_, err = png.Decode(f)
		assert.NoError(t, err, name)
		f.Close()
	}
	// The replica samples of the disaggregated run, none for the coupled
	// one (no index).
	b, err := os.ReadFile(filepath.Join(dir, "sim-load-balance+reject-replicas.csv"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(b), "time_s,blocks_held,max_replicas,hot_blocks,hot_replicas_mean,"), "%s", b)
	_, err = os.Stat(filepath.Join(dir, "sim-coupled+prefix-cache-replicas.csv"))
	assert.True(t, os.IsNotExist(err))
}

// --replica-interval sets the sampling period: one row per period of the
// simulated time, and one at the end.
func TestSimReplicaInterval(t *testing.T) {
	dir := t.TempDir()
	_, err := runSim(t, "--max-requests", "200", "--replica-interval", "10s", "--hot-blocks", "5", "--out", dir)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "sim-global-cache-aware+reject-replicas.csv"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Greater(t, len(lines), 3)
	assert.True(t, strings.HasPrefix(lines[1], "10,"), lines[1])
	assert.True(t, strings.HasPrefix(lines[2], "20,"), lines[2])
	assert.Equal(t, "5", strings.Split(lines[1], ",")[3], "hot_blocks")

	// Negative: no sampling, no file.
	dir = t.TempDir()
	_, err = runSim(t, "--max-requests", "50", "--replica-interval", "-1s", "--out", dir)
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "sim-global-cache-aware+reject-replicas.csv"))
	assert.True(t, os.IsNotExist(err))
	_, err = os.Stat(filepath.Join(dir, "sim-replicas.png"))
	assert.True(t, os.IsNotExist(err))
}

// The figure subcommands run on a prefix of the trace and write their
// plots.
func TestSimFigures(t *testing.T) {
	for _, tc := range []struct {
		fig  string
		want string // in the text output
	}{
		{"fig5", "below local-cache-aware"},
		{"fig9", "infinite"},
		{"fig10", "global vs local"},
		{"fig1", "TBT threshold"},
		// The capacity sweep of the paper's Fig. 1.
		{"fig1 --capacity --rates 0.5,2", "highest load"},
	} {
		t.Run(tc.fig, func(t *testing.T) {
			dir := t.TempDir()
			args := append(strings.Fields(tc.fig), "--max-requests", "150")
			out, err := runSim(t, append(args, "--out", dir)...)
			require.NoError(t, err)
			assert.Contains(t, out, tc.want)
			png := strings.Fields(tc.fig)[0] + ".png"
			if strings.Contains(tc.fig, "--capacity") {
				png = "fig1-capacity.png"
			}
			_, err = os.Stat(filepath.Join(dir, png))
			assert.NoError(t, err)

			out, err = runSim(t, append(args, "--json")...)
			require.NoError(t, err)
			assert.True(t, json.Valid([]byte(out)), out)
		})
	}
}

// Bad input: clear errors, with the line of a malformed trace.
func TestSimErrors(t *testing.T) {
	dir := t.TempDir()
	good := `{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}`
	for _, tc := range []struct {
		name  string
		trace string // written to a file for --trace; "" for none
		args  []string
		want  string
	}{
		// A malformed line names its number (blank lines count).
		{"bad json", good + "\n\n{\"timestamp\": 1,\n", nil, "malformed line 3"},
		// A field out of range names the field.
		{"negative", good + "\n" + `{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": []}`, nil,
			"malformed line 2: negative input_length -5"},
		// Time going backwards.
		{"order", `{"timestamp": 9, "input_length": 600, "output_length": 2, "hash_ids": [1]}` + "\n" + good, nil,
			"request 2 of the trace (from 1) arrives at 0 ms"},
		{"policy", "", []string{"--policy", "fastest"}, `policy "fastest"`},
		{"admission", "", []string{"--admission", "maybe"}, `admission "maybe"`},
		{"instances", "", []string{"--prefill", "-1"}, "Config.Prefill"},
		{"missing file", "", []string{"--trace", filepath.Join(dir, "nope.jsonl")}, "no such file"},
		{"rates", "", []string{"fig1", "--capacity", "--rates", "2,1"}, "increasing order"},
		{"target", "", []string{"fig1", "--capacity", "--target", "0"}, "--target 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(tc.args, "--json")
			if tc.trace != "" {
				p := filepath.Join(t.TempDir(), "trace.jsonl")
				require.NoError(t, os.WriteFile(p, []byte(tc.trace), 0o644))
				args = append(args, "--trace", p)
			}
			_, err := runSim(t, args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
