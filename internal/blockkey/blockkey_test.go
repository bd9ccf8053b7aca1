package blockkey_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mooncake-go/mooncake/internal/blockkey"
)

func TestSeqHash(t *testing.T) {
	for _, tc := range []struct {
		key string
		h   uint64
		ok  bool
	}{
		// Block's forms, as the Conductor reads them.
		{"llama@0@00000000000000ff", 255, true},
		{"run7@blk-42", 42, true},
		// 16 decimal digits are Key's hex form, not decimal: Key("", 0x10).
		{"0000000000000010", 16, true},
		{"1234567890123456", 0x1234567890123456, true},
		// Official Mooncake's whole-key forms: decimal and 0x hex.
		{"0", 0, true},
		{"42", 42, true},
		{"007", 7, true},
		{"18446744073709551615", 1<<64 - 1, true},
		{"0x2a", 42, true},
		{"0X2A", 42, true},
		{"0xFFFFFFFFFFFFFFFF", 1<<64 - 1, true},
		// Not blocks: overflow, signs, empty digits, 17 hex digits, junk,
		// a decimal or 0x field after an '@' (only the whole key counts).
		{"18446744073709551616", 0, false},
		{"+1", 0, false},
		{"-1", 0, false},
		{"0x", 0, false},
		{"0x-1", 0, false},
		{"0x1_0", 0, false},
		{"0x00000000000000001", 0, false},
		{"0xg", 0, false},
		{"12a", 0, false},
		{"m@42", 0, false},
		{"m@0x2a", 0, false},
		{"config.json", 0, false},
		{"", 0, false},
	} {
		h, ok := blockkey.SeqHash(tc.key)
		assert.Equal(t, tc.ok, ok, tc.key)
		assert.Equal(t, tc.h, h, tc.key)
	}
}

// Every key Key writes reads back as its block, through Block and SeqHash.
func TestKeyRoundTrip(t *testing.T) {
	for _, prefix := range []string{"", "m@3"} {
		for _, h := range []uint64{0, 1, 0x10, 0xdeadbeef, 0x1234567890123456, 1 << 63, 1<<64 - 1} {
			k := blockkey.Key(prefix, h)
			got, ok := blockkey.Block(k)
			assert.True(t, ok, k)
			assert.Equal(t, h, got, k)
			got, ok = blockkey.SeqHash(k)
			assert.True(t, ok, k)
			assert.Equal(t, h, got, k)
		}
	}
}

func FuzzSeqHash(f *testing.F) {
	f.Add("m@0@00000000000000ff")
	f.Add("blk-7")
	f.Add("0x2a")
	f.Add("42")
	f.Fuzz(func(t *testing.T, key string) {
		h, ok := blockkey.SeqHash(key)
		if !ok {
			return
		}
		if b, isBlock := blockkey.Block(key); isBlock {
			if b != h {
				t.Fatalf("SeqHash(%q) = %d, Block says %d", key, h, b)
			}
			return
		}
		// Otherwise the whole key is the number, in decimal or 0x hex.
		x := strings.ToLower(strings.TrimLeft(strings.TrimPrefix(strings.ToLower(key), "0x"), "0"))
		if x != strconv.FormatUint(h, 10) && x != strconv.FormatUint(h, 16) && !(h == 0 && x == "") {
			t.Fatalf("SeqHash(%q) = %d", key, h)
		}
	})
}
