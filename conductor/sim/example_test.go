package sim_test

import (
	"fmt"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/sim"
	"github.com/mooncake-go/mooncake/internal/trace"
)

// Two turns of one conversation on a single prefill instance: the second
// reuses the first's two blocks from the instance's cache.
func Example() {
	reqs := []trace.Request{
		{Timestamp: 0, InputLength: 1100, OutputLength: 200, HashIDs: []int64{1, 2, 3}},
		{Timestamp: 60_000, InputLength: 1600, OutputLength: 100, HashIDs: []int64{1, 2, 4, 5}},
	}
	res, err := sim.Run(sim.Config{Policy: conductor.GlobalCacheAware, Prefill: 1, Decode: 1}, reqs)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, o := range res.Outcomes {
		fmt.Printf("request %d on %s/%s: reused %d tokens, TTFT %v\n", o.Index, o.Prefill, o.Decode,
			o.HitTokens, o.TTFT.Round(1e6))
	}
	s := res.Summary()
	fmt.Printf("hit ratio %.1f%%, effective %.0f%%\n", 100*s.CacheHitRatio, 100*s.EffectiveRequestRatio)
	// Output:
	// request 0 on p0/d0: reused 0 tokens, TTFT 117ms
	// request 1 on p0/d0: reused 1024 tokens, TTFT 69ms
	// hit ratio 37.9%, effective 100%
}
