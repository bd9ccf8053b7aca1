package trace_test

import (
	"context"
	"fmt"

	"github.com/mooncake-go/mooncake/bench/trace"
)

// Replay the first thousand requests of the conversation trace through a
// store that keeps the 8,000 most recently used blocks, one request at a
// time, and compare the hit ratio with its infinite-cache bound.
func ExampleReplay() {
	store := newMemStore(8000)
	res, err := trace.Replay(context.Background(), store,
		trace.Options{MaxRequests: 1000, Concurrency: 1, BlockBytes: 1 << 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d requests, %d blocks\n", res.Requests, res.Blocks)
	fmt.Printf("hit ratio %.3f, infinite-cache bound %.3f\n", res.HitRatio, res.InfiniteHitRatio)
	// Output:
	// 1000 requests, 27305 blocks
	// hit ratio 0.158, infinite-cache bound 0.212
}
