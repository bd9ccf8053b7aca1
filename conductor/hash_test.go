package conductor_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mooncake-go/mooncake/conductor"
)

// tokens is a made-up prompt of n tokens.
func tokens(n, seed int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = (i*31 + seed) % 128256
	}
	return out
}

func TestHashTokens(t *testing.T) {
	a := tokens(3*conductor.BlockTokens+100, 0)
	h := conductor.HashTokens(a)
	// Full blocks only: the partial fourth has no hash.
	assert.Len(t, h, 3)
	assert.Nil(t, conductor.HashTokens(a[:conductor.BlockTokens-1]))
	// Deterministic, and pinned: other processes compute the same keys.
	assert.Equal(t, h, conductor.HashTokens(a))
	assert.Equal(t, []uint64{0x29468728e04308ab, 0x49dbc952cafc95e3, 0x7698948a33719b00}, h,
		"FNV-1a over the previous hash and the tokens, 8 bytes little-endian each")

	// Chained: a prompt that differs in block 1 shares block 0's hash
	// only; one that differs in block 0 shares none, even where its later
	// tokens are the same.
	b := append([]int(nil), a...)
	b[conductor.BlockTokens+7]++
	hb := conductor.HashTokens(b)
	assert.Equal(t, h[0], hb[0])
	assert.NotEqual(t, h[1], hb[1])
	assert.NotEqual(t, h[2], hb[2])
	c := append([]int(nil), a...)
	c[0]++
	hc := conductor.HashTokens(c)
	for i := range h {
		assert.NotEqual(t, h[i], hc[i], "block %d", i)
	}
	// Token ids are hashed whole, not truncated to a byte or 32 bits.
	d := append([]int(nil), a[:conductor.BlockTokens]...)
	d[0] += 1 << 32
	assert.NotEqual(t, h[0], conductor.HashTokens(d)[0])
}
