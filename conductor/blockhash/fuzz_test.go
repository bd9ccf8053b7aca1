package blockhash

import (
	"encoding/binary"
	"slices"
	"testing"
)

var fuzzSpecs = []string{"fnv", "mooncake", "vllm:sha256", "vllm:sha256_cbor", "vllm:xxhash", "vllm:xxhash_cbor"}

// FuzzBlocks: for any tokens and block size, every scheme returns one id
// per full block, and the ids of a prefix are a prefix of the ids (the
// chaining the prefix index relies on), with or without request extras;
// an extra that cannot be hashed gives no ids.
func FuzzBlocks(f *testing.F) {
	f.Add([]byte{}, uint16(16), uint8(0), uint16(0), "", "")
	f.Add([]byte("0123456789abcdef0123456789abcdef"), uint16(1), uint8(2), uint16(3), "salt", "")
	f.Add(make([]byte, 8*40), uint16(3), uint8(3), uint16(17), "", "lora")
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0x80}, uint16(2), uint8(5), uint16(1), "\xff", "x")
	f.Fuzz(func(t *testing.T, raw []byte, bs uint16, which uint8, cut uint16, salt, lora string) {
		blockSize := int(bs)%MaxPickleBlockSize + 1
		spec := fuzzSpecs[int(which)%len(fuzzSpecs)]
		s, err := Parse(spec, blockSize, seedFor(spec))
		if err != nil {
			t.Fatal(err)
		}
		// Each 8 bytes is one token, any int64, negatives included.
		tokens := make([]int, len(raw)/8)
		for i := range tokens {
			tokens[i] = int(int64(binary.LittleEndian.Uint64(raw[8*i:])))
		}
		x := Extra{LoRAName: lora, LoRAPath: "/" + lora, CacheSalt: salt}
		ids := BlocksFor(s, nil, tokens, x)
		want := len(tokens) / blockSize
		if _, takes := s.(ExtraScheme); takes && x.Validate() != nil {
			want = 0
		}
		if len(ids) != want {
			t.Fatalf("%s/%d: %d ids for %d tokens", spec, blockSize, len(ids), len(tokens))
		}
		prefix := tokens[:int(cut)%(len(tokens)+1)]
		if p := BlocksFor(s, nil, prefix, x); !slices.Equal(p, ids[:len(p)]) {
			t.Fatalf("%s/%d: ids of the first %d tokens %v are not a prefix of %v", spec, blockSize, len(prefix), p, ids)
		}
	})
}
