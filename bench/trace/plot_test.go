package trace

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/plot"
)

// The latency panel shows every get, however slow, on a log axis when
// the latencies span decades.
func TestLatencyPanel(t *testing.T) {
	for _, tc := range []struct {
		name string
		lat  []time.Duration
		log  bool
	}{
		// Gets of 50 us to 80 ms, as a store with a slow tail gives.
		{"decades", []time.Duration{50 * time.Microsecond, 200 * time.Microsecond, time.Millisecond, 80 * time.Millisecond}, true},
		// Gets within a decade: a linear axis.
		{"narrow", []time.Duration{2 * time.Millisecond, 3 * time.Millisecond, 9 * time.Millisecond}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := make([]RequestResult, len(tc.lat)+1)
			for i, d := range tc.lat {
				rs[i] = RequestResult{ExistBlocks: 1, GetLatency: d}
			}
			// A request without a get has no latency to show.
			rs[len(tc.lat)] = RequestResult{GetLatency: time.Hour}
			hits, lat := hitPanel(rs), latencyPanel(rs)
			require.NoError(t, plot.Save(filepath.Join(t.TempDir(), "p.png"), hits, lat))
			assert.Equal(t, tc.log, plot.IsLog(&lat.Y))
			assert.InDelta(t, float64(tc.lat[len(tc.lat)-1])/1e6, lat.Y.Max, 1e-9, "the slowest get, unclipped")
			assert.InDelta(t, float64(tc.lat[0])/1e6, lat.Y.Min, 1e-9)
			assert.False(t, plot.IsLog(&hits.Y), "a hit ratio, from 0")
			assert.False(t, plot.IsLog(&lat.X), "request indexes, from 0")
		})
	}
}
