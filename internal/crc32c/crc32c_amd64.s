//go:build amd64 && !purego

#include "textflag.h"

// The message is read in 16-byte lanes, each a polynomial with bit 0 of
// its first byte the highest degree (see foldK in crc32c_amd64.go). Four
// ZMM accumulators hold 256 bytes; each round multiplies every lane by
// x^2048 (reduced by P to at most 96 bits) and adds the next 256 bytes.
// The accumulators are then folded into one, which takes the rest 64
// bytes at a time, its four lanes are folded into one, and
// the 16 bytes left, congruent to the message mod P, go through the
// crc32 instruction, which finishes the reduction.

// FOLD moves the lanes of acc forward by the distance whose constants are
// in k and adds them into dst, clobbering acc and tmp.
#define FOLD(k, acc, tmp, dst) \
	VPCLMULQDQ $0x00, k, acc, tmp \
	VPCLMULQDQ $0x11, k, acc, acc \
	VPTERNLOGQ $0x96, tmp, acc, dst

// func foldAVX512(crc uint32, p []byte, k *[14]uint64) uint32
TEXT ·foldAVX512(SB), NOSPLIT, $0-44
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ k+32(FP), DX

	// The pre-inversion of the CRC is added to the first four bytes.
	NOTL AX
	VMOVD AX, X4
	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VPXORQ Z4, Z0, Z0
	ADDQ $256, SI
	SUBQ $256, CX
	CMPQ CX, $256
	JB   reduce

	VBROADCASTI32X4 0(DX), Z8 // x^2048

loop:
	VPCLMULQDQ $0x00, Z8, Z0, Z4
	VPCLMULQDQ $0x11, Z8, Z0, Z0
	VPCLMULQDQ $0x00, Z8, Z1, Z5
	VPCLMULQDQ $0x11, Z8, Z1, Z1
	VPCLMULQDQ $0x00, Z8, Z2, Z6
	VPCLMULQDQ $0x11, Z8, Z2, Z2
	VPCLMULQDQ $0x00, Z8, Z3, Z7
	VPCLMULQDQ $0x11, Z8, Z3, Z3
	VPTERNLOGQ $0x96, 0(SI), Z4, Z0
	VPTERNLOGQ $0x96, 64(SI), Z5, Z1
	VPTERNLOGQ $0x96, 128(SI), Z6, Z2
	VPTERNLOGQ $0x96, 192(SI), Z7, Z3
	ADDQ $256, SI
	SUBQ $256, CX
	CMPQ CX, $256
	JAE  loop

reduce:
	// Z0, Z1 and Z2 are 192, 128 and 64 bytes before Z3.
	VBROADCASTI32X4 16(DX), Z8 // x^1536
	VBROADCASTI32X4 32(DX), Z9 // x^1024
	VBROADCASTI32X4 48(DX), Z10 // x^512
	FOLD(Z8, Z0, Z4, Z3)
	FOLD(Z9, Z1, Z5, Z3)
	FOLD(Z10, Z2, Z6, Z3)

	// Then 64 bytes at a time.
	TESTQ CX, CX
	JZ    lanes

loop64:
	VPCLMULQDQ $0x00, Z10, Z3, Z4
	VPCLMULQDQ $0x11, Z10, Z3, Z3
	VPTERNLOGQ $0x96, 0(SI), Z4, Z3
	ADDQ $64, SI
	SUBQ $64, CX
	JNZ  loop64

lanes:
	// The four lanes of Z3 into the last one, X5.
	VEXTRACTI32X4 $1, Z3, X1
	VEXTRACTI32X4 $2, Z3, X2
	VEXTRACTI32X4 $3, Z3, X5
	VMOVDQU 64(DX), X8 // x^384
	VMOVDQU 80(DX), X9 // x^256
	VMOVDQU 96(DX), X10 // x^128
	FOLD(X8, X3, X4, X5)
	FOLD(X9, X1, X6, X5)
	FOLD(X10, X2, X7, X5)

	// CRC of the 16 bytes with no conditioning, then the post-inversion.
	VMOVQ   X5, AX
	VPEXTRQ $1, X5, BX
	XORL    CX, CX
	CRC32Q  AX, CX
	CRC32Q  BX, CX
	NOTL    CX
	MOVL    CX, ret+40(FP)
	VZEROUPPER
	RET
