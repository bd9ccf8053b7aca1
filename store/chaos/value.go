package chaos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
)

// A value says who wrote it: the key, the writer and the writer's
// sequence number, then filler, then a CRC-32 (IEEE) of everything before
// it. Not CRC-32C, the store's own checksum: a value that ends with its
// CRC-32C has the same CRC-32C as every other such value (the CRC
// residue), which would blind the store's checks of what it reads.
// A get's bytes are thereby attributed to the write that made them, or
// shown to match none (torn, reused space, another key's object).
//
//	magic "MCHV" | key length u16 | key | writer u32 | seq u64 | filler ... | crc32 u32
const valueMagic = "MCHV"

// ValueID names one write: the writer (a workload client) and its
// sequence number. The zero ID is no value (a get that found nothing).
type ValueID struct {
	Writer uint32
	Seq    uint64
}

// IsZero reports whether id names no value.
func (id ValueID) IsZero() bool { return id == ValueID{} }

func (id ValueID) String() string {
	if id.IsZero() {
		return "-"
	}
	return fmt.Sprintf("w%d#%d", id.Writer, id.Seq)
}

// MinValueSize is the smallest value that holds key's header and trailer.
func MinValueSize(key string) int { return len(valueMagic) + 2 + len(key) + 4 + 8 + 4 }

// EncodeValue is the value of size bytes that write id makes for key.
// Sequence numbers start at 1: the zero ID names no value.
func EncodeValue(key string, id ValueID, size int) ([]byte, error) {
	if id.Seq == 0 {
		return nil, errors.New("chaos: value sequence numbers start at 1")
	}
	if size < MinValueSize(key) {
		return nil, fmt.Errorf("chaos: value size %d below the %d bytes that describe key %q", size, MinValueSize(key), key)
	}
	b := make([]byte, 0, size)
	b = append(b, valueMagic...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	b = binary.LittleEndian.AppendUint32(b, id.Writer)
	b = binary.LittleEndian.AppendUint64(b, id.Seq)
	// Filler that differs per write, so that two writes of one key differ
	// all along and a torn read shows in the checksum.
	r := rand.New(rand.NewPCG(uint64(id.Writer), id.Seq))
	for len(b) < size-4 {
		b = binary.LittleEndian.AppendUint64(b, r.Uint64())
	}
	b = b[:size-4]
	return binary.LittleEndian.AppendUint32(b, crc32.ChecksumIEEE(b)), nil
}

// DecodeValue attributes b: the key and write that made it, or an error
// saying why b is no value of this package (short, bad magic, bad
// checksum).
func DecodeValue(b []byte) (key string, id ValueID, err error) {
	if len(b) < MinValueSize("") || string(b[:len(valueMagic)]) != valueMagic {
		return "", ValueID{}, errors.New("not a chaos value (no header)")
	}
	n := int(binary.LittleEndian.Uint16(b[4:]))
	if len(b) < MinValueSize("")+n {
		return "", ValueID{}, fmt.Errorf("%d bytes, too short for its %d-byte key", len(b), n)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.ChecksumIEEE(body); got != sum {
		return "", ValueID{}, fmt.Errorf("checksum %08x, trailer says %08x", got, sum)
	}
	key = string(b[6 : 6+n])
	id.Writer = binary.LittleEndian.Uint32(b[6+n:])
	id.Seq = binary.LittleEndian.Uint64(b[10+n:])
	return key, id, nil
}
