package conductor_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mooncake-go/mooncake/conductor"
)

func TestBlockKey(t *testing.T) {
	assert.Equal(t, "llama@0@00000000000000ff", conductor.BlockKey("llama@0", 255))
	assert.Equal(t, "ffffffffffffffff", conductor.BlockKey("", 1<<64-1))
	for _, h := range []uint64{0, 1, 0xdeadbeef, 1 << 63, 1<<64 - 1} {
		got, ok := conductor.KeyBlock(conductor.BlockKey("m@3", h))
		assert.True(t, ok)
		assert.Equal(t, h, got)
	}
	for _, tc := range []struct {
		key string
		h   uint64
		ok  bool
	}{
		// The last field decides, whatever comes before.
		{"a@b@0000000000000010", 16, true},
		{"0000000000000010", 16, true},
		// The trace replay's keys: decimal hash ids.
		{"blk-42", 42, true},
		{"run7@blk-18446744073709551615", 1<<64 - 1, true},
		// Not blocks: other lengths, upper case, signs, leading zeros,
		// overflow, no field.
		{"000000000000010", 0, false},
		{"00000000000000010", 0, false},
		{"00000000000000FF", 0, false},
		{"blk-", 0, false},
		{"blk-+1", 0, false},
		{"blk-00", 0, false},
		{"blk-0", 0, true},
		{"blk--1", 0, false},
		{"blk-18446744073709551616", 0, false},
		{"blk-1@", 0, false},
		{"config.json", 0, false},
		{"", 0, false},
	} {
		h, ok := conductor.KeyBlock(tc.key)
		assert.Equal(t, tc.ok, ok, tc.key)
		assert.Equal(t, tc.h, h, tc.key)
	}
}

func FuzzKeyBlock(f *testing.F) {
	f.Add("m@0@00000000000000ff")
	f.Add("blk-7")
	f.Add("x@blk-0")
	f.Fuzz(func(t *testing.T, key string) {
		h, ok := conductor.KeyBlock(key)
		if !ok {
			return
		}
		// A block key ends with the hash written one of the two ways.
		if !strings.HasSuffix(key, "@"+conductor.BlockKey("", h)) && key != conductor.BlockKey("", h) &&
			!strings.HasSuffix(key, "blk-"+strconv.FormatUint(h, 10)) {
			t.Fatalf("KeyBlock(%q) = %d", key, h)
		}
	})
}
