package router

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
)

// mooncake_conductor_block_replicas counts the prefix index's blocks by
// their replicas in the prefill instances' caches when /metrics is
// scraped; the store's copies do not count.
func TestBlockReplicasMetric(t *testing.T) {
	sched, err := conductor.New(conductor.Config{})
	require.NoError(t, err)
	_, es := cluster(t, 5, 1)
	h := newHarness(t, sched, func(c *Config) {
		for i := range c.Instances {
			if c.Instances[i].Role == RolePrefill {
				c.Instances[i].CacheBlocks = 100
			}
		}
	}, es...)
	series := func(label string) string { return `mooncake_conductor_block_replicas{replicas="` + label + `"}` }
	get := func() []float64 {
		var v []float64
		for _, l := range []string{"1", "2", "3", "4+"} {
			v = append(v, h.metric(series(l)))
		}
		return v
	}
	a := h.do("GET", "/metrics", nil)
	require.Equal(t, 200, a.status)
	assert.Contains(t, string(a.body), series("4+")+" 0", "every bucket is there, empty")

	// Block 1 on all five instances, 2 on four, 3 on two, 4 and 5 on one;
	// 9 in the store only.
	for i, blocks := range [][]uint64{{1, 2, 3, 4}, {1, 2, 3, 5}, {1, 2}, {1, 2}, {1}} {
		sched.BlockStored(es[i].id, blocks)
	}
	sched.StoreAdded([]uint64{1, 9})
	assert.Equal(t, []float64{2, 1, 0, 2}, get())

	// Updated at every scrape: p0 evicts its blocks, block 1 is left on
	// four instances, 2 on three, 3 and 5 on one.
	sched.BlockRemoved("p0", []uint64{1, 2, 3, 4})
	assert.Equal(t, []float64{2, 0, 1, 1}, get())
}

// A scheduler without a replica histogram (the tests' round robin) gets
// no replica gauge.
func TestBlockReplicasMetricAbsent(t *testing.T) {
	_, es := cluster(t, 1, 1)
	h := newHarness(t, nil, nil, es...)
	a := h.do("GET", "/metrics", nil)
	require.Equal(t, 200, a.status)
	assert.NotContains(t, string(a.body), "mooncake_conductor_block_replicas")
}
