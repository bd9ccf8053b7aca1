package blockhash

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkBlocks times every scheme on prompts of 1k, 4k and 32k tokens
// in blocks of 16 and 128, in ns/token, against a yardstick timed in the
// same iterations: plain SHA-256 over exactly the bytes vllm:sha256
// digests (each block's pickle, computed beforehand). x-sha256 is the
// ratio; for vllm:sha256 what it adds to 1 is the cost of serialising and
// chaining. Interleaving the two keeps the ratio steady on a busy machine;
// ns/op counts both.
func BenchmarkBlocks(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1 << 10, 4 << 10, 32 << 10} {
		tokens := make([]int, n)
		for i := range tokens {
			tokens[i] = rng.IntN(152064) // a large vocabulary's ids
		}
		for _, bs := range []int{16, 128} {
			msgs := pickledBlocks(b, bs, tokens)
			for _, spec := range fuzzSpecs {
				s := mustParse(b, spec, bs, seedFor(spec))
				dst := make([]uint64, 0, n/bs)
				b.Run(fmt.Sprintf("%s/tokens=%d/block=%d", spec, n, bs), func(b *testing.B) {
					b.ReportAllocs()
					var own, yard time.Duration
					var sink byte
					for b.Loop() {
						t0 := time.Now()
						dst = s.Blocks(dst[:0], tokens)
						t1 := time.Now()
						for _, m := range msgs {
							h := sha256.Sum256(m)
							sink ^= h[0]
						}
						own += t1.Sub(t0)
						yard += time.Since(t1)
					}
					_ = sink
					b.ReportMetric(float64(own.Nanoseconds())/float64(b.N*n), "ns/token")
					b.ReportMetric(float64(yard.Nanoseconds())/float64(b.N*n), "sha256-ns/token")
					b.ReportMetric(float64(own)/float64(yard), "x-sha256")
				})
			}
		}
	}
}

// pickledBlocks returns the messages vllm:sha256 digests for tokens.
func pickledBlocks(b *testing.B, bs int, tokens []int) [][]byte {
	s := mustParse(b, "vllm:sha256", bs, "").(*vllmScheme)
	var msgs [][]byte
	parent := s.none
	for i := 0; i+bs <= len(tokens); i += bs {
		msg := pickleBlock(nil, parent.bytes(), tokens[i:i+bs], nil)
		parent = s.digest(msg)
		msgs = append(msgs, msg)
	}
	return msgs
}
