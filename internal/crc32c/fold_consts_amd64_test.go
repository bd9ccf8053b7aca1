//go:build amd64 && !purego

package crc32c

import (
	"hash/crc32"
	"testing"
)

// xPow returns x^n mod P in the reflected order of poly.
func xPow(n uint) uint32 {
	p := one
	for k := 0; n != 0; k, n = k+1, n>>1 {
		if n&1 != 0 {
			p = mulModP(x2k[k], p)
		}
	}
	return p
}

// foldPair returns the two constants that move a 128-bit lane forward by
// d bits (see foldK): x^(d+31) mod P for its low quadword (the higher
// degree coefficients) and x^(d-33) mod P for its high quadword.
func foldPair(d uint) [2]uint64 {
	return [2]uint64{uint64(xPow(d + 31)), uint64(xPow(d - 33))}
}

// TestFoldConstants recomputes foldK, the constants pasted into
// crc32c_amd64.go.
func TestFoldConstants(t *testing.T) {
	for i, d := range foldDistances {
		want := foldPair(d)
		got := [2]uint64{foldK[2*i], foldK[2*i+1]}
		if got != want {
			t.Errorf("fold by %d bits: have %#x, want %#x", d, got, want)
		}
	}
	// x^n mod P by repeated multiplication by x, independently of x2k.
	for _, n := range []uint{0, 1, 31, 32, 33, 95, 159, 1000} {
		p := one
		for range n {
			p = mulModP(one>>1, p)
		}
		if got := xPow(n); got != p {
			t.Errorf("xPow(%d) = %#x, want %#x", n, got, p)
		}
	}
	if testing.Verbose() {
		for _, d := range foldDistances {
			k := foldPair(d)
			t.Logf("%#08x, %#08x, // %d bits", k[0], k[1], d)
		}
	}
}

// TestFeatures logs which implementation runs here, so that a pass of the
// comparison tests on a CPU without AVX-512 is not mistaken for a test of
// the folding code.
func TestFeatures(t *testing.T) {
	t.Logf("useAVX512 = %v", useAVX512)
}

// TestFallback checks the path CPUs without AVX-512 VPCLMULQDQ take.
func TestFallback(t *testing.T) {
	saved := useAVX512
	defer func() { useAVX512 = saved }()
	useAVX512 = false
	b := make([]byte, 5000)
	for i := range b {
		b[i] = byte(i * 131)
	}
	for _, n := range []int{0, 9, 256, 4096, 5000} {
		if got, want := Update(0x1234, b[:n]), crc32.Update(0x1234, table, b[:n]); got != want {
			t.Errorf("Update of %d bytes = %#x, want %#x", n, got, want)
		}
	}
}
