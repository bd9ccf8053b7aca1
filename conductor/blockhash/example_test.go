package blockhash_test

import (
	"fmt"

	"github.com/mooncake-go/mooncake/conductor/blockhash"
)

// The ids of a prompt's blocks under vLLM's default hash, block size 4:
// ten tokens make two full blocks, and the prompt that extends the first
// eight tokens shares both ids.
func Example() {
	s, err := blockhash.Parse("vllm", 4, "")
	if err != nil {
		panic(err)
	}
	a := s.Blocks(nil, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	b := s.Blocks(nil, []int{1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14})
	fmt.Println(s, len(a), len(b), a[0] == b[0], a[1] == b[1])
	// Output: vllm:sha256 2 3 true true
}
