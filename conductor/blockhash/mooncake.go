package blockhash

import (
	"encoding/binary"
	"slices"
	"sync"

	"github.com/zeebo/xxh3"
)

// mooncakeScheme is the standard hash of Mooncake's KV Events API, which
// the official Conductor indexes and any publisher may use instead of
// sending token ids: with seed S,
//
//	local[i]    = XXH3-64(block i's tokens as little-endian u32, S)
//	seq_hash[0] = local[0]
//	seq_hash[i] = XXH3-64(seq_hash[i-1] LE64 || local[i] LE64, S)
//
// Token ids are u32 on the wire; larger or negative ints are truncated to
// their low 32 bits, as a C++ cast would.
type mooncakeScheme struct {
	blockSize int
	seed      uint64
	// scratch holds *[]byte of 4*blockSize bytes: one block's tokens.
	scratch sync.Pool
}

var _ Scheme = (*mooncakeScheme)(nil)

func newMooncake(blockSize int, seed uint64) *mooncakeScheme {
	s := &mooncakeScheme{blockSize: blockSize, seed: seed}
	s.scratch.New = func() any {
		b := make([]byte, 4*blockSize)
		return &b
	}
	return s
}

func (s *mooncakeScheme) BlockSize() int { return s.blockSize }

func (s *mooncakeScheme) String() string { return "mooncake" }

func (s *mooncakeScheme) Blocks(dst []uint64, tokens []int) []uint64 {
	if len(tokens) < s.blockSize {
		return dst
	}
	dst = slices.Grow(dst, len(tokens)/s.blockSize)
	bp := s.scratch.Get().(*[]byte)
	defer s.scratch.Put(bp)
	buf := *bp
	var pair [16]byte
	for i := 0; i+s.blockSize <= len(tokens); i += s.blockSize {
		for j, t := range tokens[i : i+s.blockSize] {
			binary.LittleEndian.PutUint32(buf[4*j:], uint32(t))
		}
		h := xxh3.HashSeed(buf, s.seed)
		if i > 0 {
			// pair[:8] still holds the previous block's seq_hash.
			binary.LittleEndian.PutUint64(pair[8:], h)
			h = xxh3.HashSeed(pair[:], s.seed)
		}
		binary.LittleEndian.PutUint64(pair[:8], h)
		dst = append(dst, h)
	}
	return dst
}
