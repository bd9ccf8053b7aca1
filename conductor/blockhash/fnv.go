package blockhash

import (
	"encoding/binary"
	"slices"
)

// FNV-1a, 64 bits.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvScheme is the Conductor's own chained hash, kept bit for bit because
// the traces' hash_ids and the simulator are built on it: block i's id is
// FNV-1a over block i-1's id (8 bytes little-endian; nothing for block 0)
// followed by the block's tokens, 8 bytes little-endian each.
type fnvScheme struct{ blockSize int }

var _ Scheme = fnvScheme{}

func (s fnvScheme) BlockSize() int { return s.blockSize }

func (s fnvScheme) String() string { return "fnv" }

func (s fnvScheme) Blocks(dst []uint64, tokens []int) []uint64 {
	dst = slices.Grow(dst, len(tokens)/s.blockSize)
	var buf [8]byte
	var prev uint64
	for i := 0; i+s.blockSize <= len(tokens); i += s.blockSize {
		h := uint64(fnvOffset)
		if i > 0 {
			binary.LittleEndian.PutUint64(buf[:], prev)
			h = fnvBytes(h, buf[:])
		}
		for _, t := range tokens[i : i+s.blockSize] {
			binary.LittleEndian.PutUint64(buf[:], uint64(t))
			h = fnvBytes(h, buf[:])
		}
		dst = append(dst, h)
		prev = h
	}
	return dst
}

func fnvBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}
