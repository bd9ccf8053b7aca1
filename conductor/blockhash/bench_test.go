package blockhash

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkBlocks times every scheme on prompts of 1k, 4k and 32k tokens
// in blocks of 16 and 128, in ns/token. The yardstick, "sha256-only", is
// plain SHA-256 over exactly the bytes vllm:sha256 digests (each block's
// pickle, computed beforehand): vllm:sha256 over it is the cost of
// serialising and chaining.
func BenchmarkBlocks(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1 << 10, 4 << 10, 32 << 10} {
		tokens := make([]int, n)
		for i := range tokens {
			tokens[i] = rng.IntN(152064) // a large vocabulary's ids
		}
		for _, bs := range []int{16, 128} {
			name := fmt.Sprintf("tokens=%d/block=%d", n, bs)
			b.Run("sha256-only/"+name, func(b *testing.B) { benchSHA256(b, bs, tokens) })
			for _, spec := range fuzzSpecs {
				s := mustParse(b, spec, bs, seedFor(spec))
				dst := make([]uint64, 0, n/bs)
				b.Run(spec+"/"+name, func(b *testing.B) {
					b.SetBytes(int64(8 * n))
					b.ReportAllocs()
					for b.Loop() {
						dst = s.Blocks(dst[:0], tokens)
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
				})
			}
		}
	}
}

func benchSHA256(b *testing.B, bs int, tokens []int) {
	s := mustParse(b, "vllm:sha256", bs, "").(*vllmScheme)
	var msgs [][]byte
	parent := s.none
	for i := 0; i+bs <= len(tokens); i += bs {
		msg := pickleBlock(nil, parent.bytes(), tokens[i:i+bs])
		parent = s.digest(msg)
		msgs = append(msgs, msg)
	}
	b.SetBytes(int64(8 * len(tokens)))
	b.ReportAllocs()
	var sink byte
	for b.Loop() {
		for _, m := range msgs {
			h := sha256.Sum256(m)
			sink ^= h[0]
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(tokens)), "ns/token")
	_ = sink
}
