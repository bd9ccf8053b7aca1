// Package crc32c computes CRC-32C (Castagnoli) checksums of byte ranges
// and combines the checksums of adjacent ranges without reading them again.
//
// Combining is what lets a transfer checksum its slices as they land, in
// whatever order and on whichever goroutine, and still produce the checksum
// of the whole: the CRC of A||B is the CRC of A multiplied by x^(8|B|)
// modulo the CRC polynomial, plus (xor) the CRC of B. The pre- and
// post-conditioning of the standard CRC cancel in that sum, so it holds for
// the values hash/crc32 returns. Multiplication by x^(8n) is linear, so the
// CRC of S1||S2||...||Sk is the xor over i of Shift(crc(Si), bytes after Si):
// each slice contributes its term independently.
package crc32c

import "hash/crc32"

var table = crc32.MakeTable(crc32.Castagnoli)

// Checksum returns the CRC-32C of b.
func Checksum(b []byte) uint32 { return update(0, b) }

// Update returns the CRC-32C of the bytes summed in crc followed by b.
func Update(crc uint32, b []byte) uint32 { return update(crc, b) }

// Combine returns the CRC-32C of A||B given crcA, crcB and the length of B.
func Combine(crcA, crcB uint32, lenB uint64) uint32 { return Shift(crcA, lenB) ^ crcB }

// Shift returns the term a range with checksum crc contributes to the
// checksum of a larger range when n bytes follow it there (see the package
// comment). Shift(crc, 0) is crc.
func Shift(crc uint32, n uint64) uint32 {
	if n == 0 || crc == 0 {
		return crc
	}
	return mulModP(xPow8n(n), crc)
}

// poly is the Castagnoli polynomial in the reflected bit order hash/crc32
// uses: bit 31 is the coefficient of x^0, bit 0 that of x^31.
const poly = 0x82f63b78

// one is the polynomial 1 (x^0) in that order.
const one = uint32(1) << 31

// mulModP returns a(x)·b(x) mod P(x). It walks a's coefficients from x^0
// up, adding b·x^k for each one set, and keeps b·x^k reduced as it goes.
func mulModP(a, b uint32) uint32 {
	var p uint32
	for m := one; a != 0 && m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			a &^= m
		}
		// b <- b·x mod P: one step toward higher powers is a right shift
		// here; the coefficient of x^31 that falls off is reduced by P.
		if b&1 != 0 {
			b = b>>1 ^ poly
		} else {
			b >>= 1
		}
	}
	return p
}

// x2k[k] is x^(2^k) mod P, for the powers xPow8n needs (8n < 2^67).
var x2k = func() (t [67]uint32) {
	t[0] = one >> 1 // x^1
	for k := 1; k < len(t); k++ {
		t[k] = mulModP(t[k-1], t[k-1])
	}
	return t
}()

// xPow8n returns x^(8n) mod P: the product of x^(2^k) over the bits k of
// 8n, so a handful of multiplications for the slice-aligned lengths
// transfers use.
func xPow8n(n uint64) uint32 {
	p := one
	for k := 3; n != 0; k, n = k+1, n>>1 {
		if n&1 != 0 {
			p = mulModP(x2k[k], p)
		}
	}
	return p
}
