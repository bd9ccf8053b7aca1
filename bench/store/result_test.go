package store

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	assert.Equal(t, Result{}, Median(nil))
	runs := []Result{{GBPerS: 3, P50us: 30}, {GBPerS: 1, P50us: 10}, {GBPerS: 2, P50us: 20}}
	// The whole middle run, latencies included.
	assert.Equal(t, runs[2], Median(runs))
	// Even count: the lower middle.
	assert.Equal(t, runs[2], Median(append(runs, Result{GBPerS: 4})))
	assert.Equal(t, 3.0, runs[0].GBPerS, "Median leaves its argument alone")
}

func TestWriteTable(t *testing.T) {
	get := func(name, topo string, clients int, gbps float64) Result {
		return Result{Name: name, Topology: topo, Op: OpGet, ValueSize: 1 << 20, BatchSize: 1, Clients: clients,
			Seconds: 1, OpsPerS: gbps * 1e9 / (1 << 20), GBPerS: gbps, P50us: 100, P99us: 200}
	}
	rs := []Result{
		get(Redis, "", 1, 2), get(Official, Remote, 1, 1), get(Ours, "", 1, 4),
		// No Redis row at 2 clients: no ratio.
		get(Ours, "", 2, 5),
	}
	var b strings.Builder
	require.NoError(t, WriteTable(&b, rs, Redis))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 6)
	assert.Contains(t, lines[0], "ratio = GB/s / redis GB/s")
	assert.Regexp(t, `system +topology +op +value +batch +clients .* x redis$`, lines[1])
	assert.Regexp(t, `^ +redis +- +get +1MiB +1 +1 +1\.00 +1907 +2\.000 +100 +200 +1\.00$`, lines[2])
	assert.Regexp(t, ` official +remote .* 1\.000 .* 0\.50$`, lines[3])
	assert.Regexp(t, ` mooncake-go .* 4\.000 .* 2\.00$`, lines[4])
	assert.Regexp(t, ` mooncake-go .* 5\.000 .* -$`, lines[5])
}
