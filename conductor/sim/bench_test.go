package sim_test

import (
	"testing"
	"time"

	"github.com/mooncake-go/mooncake/conductor/sim"
	"github.com/mooncake-go/mooncake/internal/trace"
)

// BenchmarkRun replays the whole conversation trace (12,031 requests, an
// hour) per iteration, Mooncake's policy and the coupled baseline; the
// yardstick is the trace's own duration: x-realtime is simulated time over
// wall time. The budget is 30 s a replay.
func BenchmarkRun(b *testing.B) {
	reqs := trace.Conversation()
	for _, cfg := range []sim.Config{{}, {Coupled: true}} {
		b.Run(cfg.Name(), func(b *testing.B) {
			var simulated time.Duration
			start := time.Now()
			for range b.N {
				res, err := sim.Run(cfg, reqs)
				if err != nil {
					b.Fatal(err)
				}
				simulated = time.Duration(res.Summary().SimulatedS * 1e9)
			}
			wall := time.Since(start) / time.Duration(b.N)
			b.ReportMetric(float64(len(reqs))/wall.Seconds(), "requests/s")
			b.ReportMetric(simulated.Seconds()/wall.Seconds(), "x-realtime")
		})
	}
}
