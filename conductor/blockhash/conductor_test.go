package blockhash_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/blockhash"
)

// The fnv scheme at the Conductor's block size must keep
// conductor.HashTokens' values: the traces' hash_ids and the simulator's
// prefix index are built on them.
func TestFNVIsHashTokens(t *testing.T) {
	s, err := blockhash.Parse("fnv", conductor.BlockTokens, "")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, conductor.BlockTokens - 1, conductor.BlockTokens, 3*conductor.BlockTokens + 17} {
		tokens := make([]int, n)
		for i := range tokens {
			tokens[i] = rng.IntN(200000)
		}
		if n > 0 {
			tokens[0] = math.MaxInt64 // all 8 bytes count
		}
		want := conductor.HashTokens(tokens)
		if got := s.Blocks(nil, tokens); !slices.Equal(got, want) {
			t.Fatalf("%d tokens: fnv %v, conductor.HashTokens %v", n, got, want)
		}
	}
}
