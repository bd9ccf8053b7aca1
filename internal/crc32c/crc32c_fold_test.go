package crc32c

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestCheckValue(t *testing.T) {
	if got := Checksum([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("Checksum(123456789) = %#x, want 0xe3069283", got)
	}
}

// TestEveryLength compares with hash/crc32 for every length up to 4 KiB,
// from zero and from a random crc, at every start offset modulo 64.
func TestEveryLength(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	buf := randBytes(r, 4096+64)
	for n := 0; n <= 4096; n++ {
		off := n % 64
		b := buf[off : off+n]
		if got, want := Checksum(b), crc32.Checksum(b, table); got != want {
			t.Fatalf("Checksum of %d bytes at offset %d = %#x, want %#x", n, off, got, want)
		}
		c := r.Uint32()
		if got, want := Update(c, b), crc32.Update(c, table, b); got != want {
			t.Fatalf("Update(%#x) of %d bytes at offset %d = %#x, want %#x", c, n, off, got, want)
		}
	}
}

// TestOffsets covers every start offset 0..63 for lengths around the
// folding thresholds and block sizes.
func TestOffsets(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	buf := randBytes(r, 20000)
	for off := 0; off < 64; off++ {
		for _, n := range []int{0, 1, 15, 16, 255, 256, 257, 1023, 1024, 1025, 1279, 1280, 4096, 4096 + 255, 10000, 16384} {
			b := buf[off : off+n]
			c := r.Uint32()
			if got, want := Update(c, b), crc32.Update(c, table, b); got != want {
				t.Fatalf("Update(%#x) of %d bytes at offset %d = %#x, want %#x", c, n, off, got, want)
			}
		}
	}
}

// TestRandomLengths compares with hash/crc32 for random lengths up to
// 4 MiB, random offsets and random initial crc values.
func TestRandomLengths(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	buf := randBytes(r, 4<<20+64)
	iters := 200
	if testing.Short() {
		iters = 20
	}
	for range iters {
		n := r.IntN(4<<20 + 1)
		off := r.IntN(64)
		b := buf[off : off+n]
		c := r.Uint32()
		if got, want := Update(c, b), crc32.Update(c, table, b); got != want {
			t.Fatalf("Update(%#x) of %d bytes at offset %d = %#x, want %#x", c, n, off, got, want)
		}
		if got, want := Checksum(b), crc32.Checksum(b, table); got != want {
			t.Fatalf("Checksum of %d bytes at offset %d = %#x, want %#x", n, off, got, want)
		}
	}
}

// TestSplitUpdates checks that Update chained over pieces of any size
// gives the checksum of the whole.
func TestSplitUpdates(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	buf := randBytes(r, 1<<20)
	want := crc32.Checksum(buf, table)
	for range 20 {
		var c uint32
		for b := buf; len(b) > 0; {
			n := min(len(b), r.IntN(8192))
			c = Update(c, b[:n])
			b = b[n:]
		}
		if c != want {
			t.Fatalf("chained Update = %#x, want %#x", c, want)
		}
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), []byte("123456789"))
	f.Add(uint32(0xffffffff), make([]byte, 1024))
	f.Add(uint32(0x12345678), make([]byte, 4096+17))
	f.Fuzz(func(t *testing.T, crc uint32, b []byte) {
		if got, want := Update(crc, b), crc32.Update(crc, table, b); got != want {
			t.Fatalf("Update(%#x) of %d bytes = %#x, want %#x", crc, len(b), got, want)
		}
	})
}

func BenchmarkChecksum(b *testing.B) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, size := range []int{4 << 10, 128 << 10, 1 << 20} {
		buf := randBytes(r, size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.Run("stdlib", func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					crc32.Checksum(buf, table)
				}
			})
			b.Run("ours", func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					Checksum(buf)
				}
			})
		})
	}
}
