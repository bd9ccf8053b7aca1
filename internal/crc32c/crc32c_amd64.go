//go:build amd64 && !purego

package crc32c

import (
	"hash/crc32"

	"golang.org/x/sys/cpu"
)

// useAVX512 says whether foldAVX512 can run: it needs AVX-512F registers,
// VPCLMULQDQ on them, AVX-512VL (VPTERNLOGQ on XMM registers), and SSE4.2
// for the final crc32 instructions. x/sys/cpu reports VPCLMULQDQ only
// with AVX-512, so CPUs with 256-bit VPCLMULQDQ alone use hash/crc32.
var useAVX512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// minFold is the shortest input foldAVX512 takes; it is faster than
// hash/crc32 from there on.
const minFold = 256

// foldDistances lists, in the order of foldK, the distances in bits that
// foldAVX512 moves 128-bit lanes forward by.
var foldDistances = [...]uint{2048, 1536, 1024, 512, 384, 256, 128}

// foldK holds a pair of constants per entry of foldDistances. A 128-bit
// lane holds 16 message bytes, bit i the coefficient of x^(127-i) (bit 0
// of the first byte is the highest degree, as in the reflected CRC).
// Moving it forward by d bits multiplies it by x^d: its low quadword h
// (degrees 64..127) by x^(64+d) and its high quadword l by x^d, each
// replaced by its remainder mod P. A constant c of the reflected form
// hash/crc32 uses, zero-extended to 64 bits, stands for c·x^32 as a
// reflected 64-bit polynomial, and the carry-less product of two reflected
// 64-bit polynomials is the reflected 128-bit product times x; so the
// pair is x^(d+31) mod P (for h) and x^(d-33) mod P (for l).
//
// Computed by foldPair in fold_consts_amd64_test.go (x^n mod P by
// square-and-multiply with mulModP); TestFoldConstants checks them.
var foldK = [...]uint64{
	0xdcb17aa4, 0xb9e02b86, // 2048 bits
	0xa87ab8a8, 0xab7aff2a, // 1536 bits
	0x6992cea2, 0x0d3b6092, // 1024 bits
	0x740eef02, 0x9e4addf8, // 512 bits
	0x1c291d04, 0xddc0152b, // 384 bits
	0x3da6d0cb, 0xba4fc28e, // 256 bits
	0xf20c0dfe, 0x493c7d27, // 128 bits
}

// foldAVX512 returns the CRC-32C of the bytes summed in crc followed by p,
// whose length is a multiple of 64 and at least 256.
//
//go:noescape
func foldAVX512(crc uint32, p []byte, k *[14]uint64) uint32

func update(crc uint32, b []byte) uint32 {
	if useAVX512 && len(b) >= minFold {
		n := len(b) &^ 63
		crc = foldAVX512(crc, b[:n], &foldK)
		b = b[n:]
	}
	return crc32.Update(crc, table, b)
}
