package crc32c

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCombine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 3<<20)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	cases := []struct {
		name string
		n, k int // bytes and split point
	}{
		{"empty tail", 100, 100}, // Shift by zero is the identity
		{"empty head", 100, 0},   // a zero CRC contributes nothing
		{"one byte each", 2, 1},  // smallest non-trivial split
		{"odd split", 1000, 333}, // lengths that are no power of two
		{"slice aligned", 1 << 20, 256 << 10},
		{"large tail", 3 << 20, 5}, // many bits in the shift length
		{"unaligned large", 3<<20 - 7, 1<<20 + 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := buf[:c.k], buf[c.k:c.n]
			require.Equal(t, Checksum(buf[:c.n]), Combine(Checksum(a), Checksum(b), uint64(len(b))))
		})
	}
}

// TestTermsInAnyOrder checks the property transfers rely on: the xor of
// every slice's term, taken in any order, is the checksum of the whole.
func TestTermsInAnyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		n := 1 + r.IntN(1<<20)
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		var cuts []int
		for off := 0; off < n; off += 1 + r.IntN(n/3+1) {
			cuts = append(cuts, off)
		}
		cuts = append(cuts, n)
		var sum uint32
		for _, i := range r.Perm(len(cuts) - 1) {
			lo, hi := cuts[i], cuts[i+1]
			sum ^= Shift(Checksum(buf[lo:hi]), uint64(n-hi))
		}
		require.Equal(t, Checksum(buf), sum, "%d bytes in %d slices", n, len(cuts)-1)
	}
}

func TestUpdate(t *testing.T) {
	b := []byte("the quick brown fox jumps over the lazy dog")
	require.Equal(t, Checksum(b), Update(Checksum(b[:10]), b[10:]))
	// The check value of CRC-32C ("123456789").
	require.Equal(t, uint32(0xe3069283), Checksum([]byte("123456789")))
}

func BenchmarkShift(b *testing.B) {
	for _, n := range []uint64{768 << 10, 1<<30 - 12345} {
		b.Run("", func(b *testing.B) {
			for b.Loop() {
				Shift(0x12345678, n)
			}
		})
	}
}
