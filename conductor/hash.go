package conductor

import "encoding/binary"

// FNV-1a, 64 bits.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// HashTokens returns the chained hashes of the full BlockTokens-token
// blocks of tokens, in order; a partial last block has none, since no
// other prompt can reuse it as a whole block.
//
// The hash is FNV-1a (64 bits) over the previous block's hash, as 8 bytes
// little-endian (nothing for the first block), followed by the block's
// tokens, each as 8 bytes little-endian. Chaining makes block i's hash
// stand for the whole prefix of tokens 0..512(i+1), as the prefix index
// and the traces' hash_ids need: two prompts share a hash only if they
// share every token up to the end of that block. It is deterministic
// across processes and versions, so a router, an engine's event publisher
// and the store can compute the same keys independently.
func HashTokens(tokens []int) []uint64 {
	n := len(tokens) / BlockTokens
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	var buf [8]byte
	var prev uint64
	for i := range n {
		h := uint64(fnvOffset)
		if i > 0 {
			binary.LittleEndian.PutUint64(buf[:], prev)
			h = fnvBytes(h, buf[:])
		}
		for _, t := range tokens[i*BlockTokens : (i+1)*BlockTokens] {
			binary.LittleEndian.PutUint64(buf[:], uint64(t))
			h = fnvBytes(h, buf[:])
		}
		out[i], prev = h, h
	}
	return out
}

func fnvBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}
