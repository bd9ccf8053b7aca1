package trace

import "encoding/binary"

// A block's payload is a function of its hash id alone, so any reader can
// check every byte it gets without remembering what was written. Block id
// starts with the 64-bit word h = splitmix64(id*γ + c), and each next word
// adds γ' (odd): a word a cycle, so checking keeps up with memory, yet the
// words of two blocks differ everywhere, a block read at the wrong offset
// differs in every word, and a block of zeroes (a hole) cannot pass.
const (
	gamma  = 0x9e3779b97f4a7c15
	gamma2 = 0xbf58476d1ce4e5b9
	// offset keeps the ids near 0 away from splitmix64's fixed point at 0.
	offset = 0x2545f4914f6cdd1d
)

func first(id int64) uint64 {
	z := uint64(id)*gamma + offset
	z = (z ^ z>>30) * gamma2
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// fill writes block id's payload into b, whatever its length.
func fill(id int64, b []byte) {
	w := first(id)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], w)
		w += gamma2
	}
	for j := 0; i < len(b); i, j = i+1, j+1 {
		b[i] = byte(w >> (8 * j))
	}
}

// verify returns the offset of the first byte of b that differs from block
// id's payload, or -1 when all of b is right.
func verify(id int64, b []byte) int {
	w := first(id)
	i := 0
	for ; i+8 <= len(b); i += 8 {
		if got := binary.LittleEndian.Uint64(b[i:]); got != w {
			for j := range 8 {
				if byte(got>>(8*j)) != byte(w>>(8*j)) {
					return i + j
				}
			}
		}
		w += gamma2
	}
	for j := 0; i < len(b); i, j = i+1, j+1 {
		if b[i] != byte(w>>(8*j)) {
			return i
		}
	}
	return -1
}
