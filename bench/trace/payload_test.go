package trace

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPayload(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 1001, 4096} {
		b := make([]byte, n)
		fill(42, b)
		require.Equal(t, -1, verify(42, b), "length %d", n)
		// Every byte is checked, the tail included.
		for _, off := range []int{0, n / 2, n - 1} {
			if off < 0 || off >= n {
				continue
			}
			b[off] ^= 1
			require.Equal(t, off, verify(42, b), "length %d", n)
			b[off] ^= 1
		}
		// Another block's payload is wrong from the first word.
		if n >= 8 {
			assert.Less(t, verify(43, b), 8, "length %d", n)
		}
	}
	// A block of zeroes, what a store might return for a hole, is wrong.
	assert.Equal(t, 0, verify(0, make([]byte, 64)))
	// The right bytes at the wrong offset are wrong.
	shifted := make([]byte, 72)
	fill(9, shifted)
	assert.Equal(t, 0, verify(9, shifted[8:]))
	// A prefix of a longer payload is the shorter payload.
	long, short := make([]byte, 100), make([]byte, 13)
	fill(-5, long)
	fill(-5, short)
	assert.Equal(t, short, long[:13])
}

func BenchmarkVerify(b *testing.B) {
	buf := make([]byte, DefaultBlockBytes)
	fill(7, buf)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if verify(7, buf) >= 0 {
			b.Fatal("mismatch")
		}
	}
}
