package blockhash

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, spec string
		blockSize  int
		seed       string
		want       string // String() on success
		err        error
	}{
		// Every spec, with the engine's default seed where it has one.
		{"fnv", "fnv", 512, "", "fnv", nil},
		{"mooncake default seed", "mooncake", 16, "", "mooncake", nil},
		{"mooncake max seed", "mooncake", 16, "18446744073709551615", "mooncake", nil},
		{"vllm is sha256", "vllm", 16, "", "vllm:sha256", nil},
		{"sha256", "vllm:sha256", 16, "", "vllm:sha256", nil},
		{"sha256_cbor", "vllm:sha256_cbor", 16, "", "vllm:sha256_cbor", nil},
		{"xxhash with seed", "vllm:xxhash", 16, "0", "vllm:xxhash", nil},
		{"xxhash_cbor with seed", "vllm:xxhash_cbor", 16, "42", "vllm:xxhash_cbor", nil},
		// The largest pickle block fits one frame; one more token is refused.
		{"pickle at the frame limit", "vllm:sha256", MaxPickleBlockSize, "", "vllm:sha256", nil},
		{"pickle past the frame limit", "vllm:sha256", MaxPickleBlockSize + 1, "", "", ErrBlockSize},
		{"xxhash past the frame limit", "vllm:xxhash", MaxPickleBlockSize + 1, "1", "", ErrBlockSize},
		// CBOR has no frames, so no such limit.
		{"cbor past the pickle limit", "vllm:sha256_cbor", MaxPickleBlockSize + 1, "", "vllm:sha256_cbor", nil},
		// Bad input, each named by its error.
		{"zero block size", "fnv", 0, "", "", ErrBlockSize},
		{"negative block size", "vllm", -16, "", "", ErrBlockSize},
		{"unknown scheme", "murmur", 16, "", "", ErrUnknownScheme},
		{"unknown vllm algo", "vllm:md5", 16, "", "", ErrUnknownScheme},
		{"case matters", "VLLM", 16, "", "", ErrUnknownScheme},
		{"xxhash without seed", "vllm:xxhash", 16, "", "", ErrSeed},
		{"xxhash_cbor without seed", "vllm:xxhash_cbor", 16, "", "", ErrSeed},
		{"fnv has no seed", "fnv", 16, "1", "", ErrSeed},
		{"mooncake seed not a number", "mooncake", 16, "abc", "", ErrSeed},
		{"mooncake seed over u64", "mooncake", 16, "18446744073709551616", "", ErrSeed},
		{"mooncake seed negative", "mooncake", 16, "-1", "", ErrSeed},
		{"vllm seed not UTF-8", "vllm", 16, "\xff", "", ErrSeed},
		{"vllm seed too long", "vllm", 16, string(make([]byte, maxSeedLen+1)), "", ErrSeed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(tc.spec, tc.blockSize, tc.seed)
			if !errors.Is(err, tc.err) {
				t.Fatalf("Parse(%q, %d, %q) error %v, want %v", tc.spec, tc.blockSize, tc.seed, err, tc.err)
			}
			if err != nil {
				return
			}
			if s.String() != tc.want || s.BlockSize() != tc.blockSize {
				t.Fatalf("got %s/%d, want %s/%d", s, s.BlockSize(), tc.want, tc.blockSize)
			}
			// String round-trips through Parse.
			if _, err := Parse(s.String(), tc.blockSize, tc.seed); err != nil {
				t.Fatalf("Parse(%q) of String: %v", s, err)
			}
		})
	}
}

// Seeds change every id, not just the first block's.
func TestSeedsDiffer(t *testing.T) {
	tokens := make([]int, 64)
	for i := range tokens {
		tokens[i] = i * 7
	}
	for _, spec := range []string{"mooncake", "vllm:sha256", "vllm:sha256_cbor", "vllm:xxhash", "vllm:xxhash_cbor"} {
		a, b := mustParse(t, spec, 16, "1"), mustParse(t, spec, 16, "2")
		ia, ib := a.Blocks(nil, tokens), b.Blocks(nil, tokens)
		for i := range ia {
			if ia[i] == ib[i] {
				t.Errorf("%s: block %d has id %#x under seeds 1 and 2", spec, i, ia[i])
			}
		}
	}
}

// The widest block the pickle schemes accept is still one pickle frame:
// CPython starts a second frame once one reaches 64 KiB, and the encoder
// only writes one.
func TestPickleOneFrame(t *testing.T) {
	tokens := make([]int, MaxPickleBlockSize)
	for i := range tokens {
		tokens[i] = []int{math.MaxInt64, math.MinInt64}[i%2]
	}
	msg := pickleBlock(nil, make([]byte, 32), tokens, nil)
	const frameSizeTarget = 64 << 10
	frameLen := binary.LittleEndian.Uint64(msg[3:])
	if msg[2] != pkFrame || frameLen != uint64(len(msg)-pkFrameHeaderLen) {
		t.Fatalf("frame header %x says %d bytes, message has %d after it", msg[:pkFrameHeaderLen], frameLen, len(msg)-pkFrameHeaderLen)
	}
	if frameLen >= frameSizeTarget {
		t.Fatalf("%d-token block of 10-byte ints is a %d-byte frame, CPython would split it", len(tokens), frameLen)
	}
	if len(msg) > maxPickleBlock(len(tokens)) {
		t.Fatalf("message is %d bytes, over maxPickleBlock %d", len(msg), maxPickleBlock(len(tokens)))
	}
}

// Bytes that CPython 3.11's pickle.dumps(obj, 5) writes, from
// pickletools.dis, for the opcodes the vectors' short seeds do not reach.
func TestPickleBytes(t *testing.T) {
	long := string(bytes.Repeat([]byte("a"), 300))
	want := append([]byte{0x80, 5, 0x95, 0x33, 1, 0, 0, 0, 0, 0, 0, 'X', 0x2c, 1, 0, 0}, long...)
	want = append(want, 0x94, '.')
	if got := pickleString(nil, long); !bytes.Equal(got, want) {
		t.Fatalf("pickle of a 300-byte str\n got %x\nwant %x", got, want)
	}
	for _, tc := range []struct {
		v    int
		want []byte
	}{
		{255, []byte{'K', 0xff}},
		{256, []byte{'M', 0, 1}},
		{-1, []byte{'J', 0xff, 0xff, 0xff, 0xff}},
		{1 << 31, []byte{0x8a, 5, 0, 0, 0, 0x80, 0}},
		{-1<<31 - 1, []byte{0x8a, 5, 0xff, 0xff, 0xff, 0x7f, 0xff}},
		{math.MaxInt64, []byte{0x8a, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}},
		{math.MinInt64, []byte{0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80}},
	} {
		if got := pickleInt(nil, tc.v); !bytes.Equal(got, tc.want) {
			t.Errorf("pickleInt(%d) = %x, want %x", tc.v, got, tc.want)
		}
	}
}

func TestBytesID(t *testing.T) {
	h := []byte{0xaa, 0xbb, 1, 2, 3, 4, 5, 6, 7, 8}
	if got := BytesID(h); got != 0x0102030405060708 {
		t.Fatalf("BytesID(%x) = %#x, want its last 8 bytes big-endian", h, got)
	}
	if got := BytesID([]byte{1, 2}); got != 0x0102 {
		t.Fatalf("BytesID(0102) = %#x", got)
	}
}

// Blocks allocates nothing once dst has room and the scratch pool is warm.
func TestBlocksAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	tokens := make([]int, 4096)
	for i := range tokens {
		tokens[i] = i * 31
	}
	for _, spec := range []string{"fnv", "mooncake", "vllm:sha256", "vllm:sha256_cbor", "vllm:xxhash", "vllm:xxhash_cbor"} {
		s := mustParse(t, spec, 16, seedFor(spec))
		dst := make([]uint64, 0, len(tokens)/16)
		s.Blocks(dst, tokens)
		if n := testing.AllocsPerRun(20, func() { s.Blocks(dst[:0], tokens) }); n != 0 {
			t.Errorf("%s: %v allocations per Blocks", spec, n)
		}
	}
}

func seedFor(spec string) string {
	switch spec {
	case "vllm:xxhash", "vllm:xxhash_cbor":
		return "0"
	}
	return ""
}

func mustParse(t testing.TB, spec string, blockSize int, seed string) Scheme {
	t.Helper()
	s, err := Parse(spec, blockSize, seed)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
