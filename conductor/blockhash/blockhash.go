package blockhash

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Scheme computes the identities of a prompt's full KV blocks.
//
// Every Scheme returned by Parse is safe for concurrent use: the ones that
// need scratch space take it from a sync.Pool.
type Scheme interface {
	// BlockSize is the number of tokens in a block.
	BlockSize() int
	// Blocks appends to dst the ids of the full blocks of tokens, in
	// order, and returns the extended slice. A trailing partial block has
	// no id: engines cache and publish whole blocks only. The id of block
	// i stands for tokens[0:(i+1)*BlockSize()], not that block alone.
	Blocks(dst []uint64, tokens []int) []uint64
	// String is the scheme's canonical spec, as Parse accepts it.
	String() string
}

// ExtraScheme is a Scheme whose engine hashes a request's extras into its
// blocks (the vLLM schemes): the same tokens under another LoRA adapter or
// cache_salt are other blocks.
type ExtraScheme interface {
	Scheme
	// BlocksExtra is Blocks for a request carrying x.
	BlocksExtra(dst []uint64, tokens []int, x Extra) []uint64
}

// Extra is what an engine hashes into a request's blocks beside their
// tokens, as vLLM's extra keys: the LoRA adapter the request runs with
// (its name and the path it was loaded from, in every block) and the
// request's cache_salt (in the first block only). The zero Extra is none.
type Extra struct {
	// LoRAName and LoRAPath name the adapter; LoRAName "" means none.
	LoRAName, LoRAPath string
	// CacheSalt is the request's cache_salt; "" means none, as vLLM
	// ignores an empty salt.
	CacheSalt string
}

// MaxExtraLen bounds the bytes of an Extra's three strings together, so
// that a block's pickled message stays in one pickle frame (see
// MaxPickleBlockSize) with room to spare.
const MaxExtraLen = 4096

// Validate says why x cannot be hashed: too long, or a string that is not
// UTF-8 (a request's JSON, as an engine decodes it, has only UTF-8 text).
func (x Extra) Validate() error {
	if n := len(x.LoRAName) + len(x.LoRAPath) + len(x.CacheSalt); n > MaxExtraLen {
		return fmt.Errorf("%w: %d bytes of LoRA name, path and cache_salt, at most %d", ErrExtra, n, MaxExtraLen)
	}
	for _, s := range []string{x.LoRAName, x.LoRAPath, x.CacheSalt} {
		if !utf8.ValidString(s) {
			return fmt.Errorf("%w: %q is not UTF-8", ErrExtra, s)
		}
	}
	return nil
}

// keys are the extra keys of a block, as vLLM tags them: ("lora", name,
// path) then ("cache_salt", salt) in the first block; nil for none.
func (x Extra) keys(first bool) [][]string {
	var k [][]string
	if x.LoRAName != "" {
		k = append(k, []string{"lora", x.LoRAName, x.LoRAPath})
	}
	if first && x.CacheSalt != "" {
		k = append(k, []string{"cache_salt", x.CacheSalt})
	}
	return k
}

// BlocksFor is s.BlocksExtra when s hashes extras, else s.Blocks: a
// scheme whose engines know no extras gives the same ids for any x.
func BlocksFor(s Scheme, dst []uint64, tokens []int, x Extra) []uint64 {
	if xs, ok := s.(ExtraScheme); ok {
		return xs.BlocksExtra(dst, tokens, x)
	}
	return s.Blocks(dst, tokens)
}

// Errors returned by Parse and Extra.Validate, wrapped with the offending
// value.
var (
	ErrUnknownScheme = errors.New("blockhash: unknown scheme")
	ErrBlockSize     = errors.New("blockhash: bad block size")
	ErrSeed          = errors.New("blockhash: bad seed")
	ErrExtra         = errors.New("blockhash: bad extra keys")
)

// MaxPickleBlockSize is the largest block size of the pickle-based vLLM
// schemes ("vllm:sha256", "vllm:xxhash"). Pickle starts a second frame once
// a message passes 64 KiB, at places that depend on CPython's pickler
// internals; a block of 4096 of the widest ids (10 bytes each as LONG1)
// stays under 41 KiB, so every accepted input is a single frame.
const MaxPickleBlockSize = 4096

// maxSeedLen bounds vLLM seeds for the same reason: the pickled seed must
// fit one frame. PYTHONHASHSEED is a decimal below 2^32 or "random".
const maxSeedLen = 1024

// Parse returns the Scheme named by spec for blocks of blockSize tokens.
//
// spec is one of:
//
//	fnv                FNV-1a chained over 8-byte tokens (conductor.HashTokens)
//	mooncake           Mooncake's KV Events standard, XXH3-64 rolling hash
//	vllm, vllm:sha256  vLLM's default prefix-caching hash
//	vllm:sha256_cbor   vLLM's --prefix-caching-hash-algo sha256_cbor
//	vllm:xxhash        vLLM's --prefix-caching-hash-algo xxhash
//	vllm:xxhash_cbor   vLLM's --prefix-caching-hash-algo xxhash_cbor
//
// seed is the engine's: "" means its default. For "mooncake" it is the
// decimal u64 S (default 0). For the vLLM schemes it is the engine's
// PYTHONHASHSEED ("" when unset: the fixed default of sha256 and
// sha256_cbor); the xxhash ones need it, since without PYTHONHASHSEED vLLM
// draws a random seed per process that no one else can know. "fnv" takes
// no seed.
func Parse(spec string, blockSize int, seed string) (Scheme, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: %d (want > 0)", ErrBlockSize, blockSize)
	}
	switch spec {
	case "fnv":
		if seed != "" {
			return nil, fmt.Errorf("%w: scheme fnv takes no seed, got %q", ErrSeed, seed)
		}
		return fnvScheme{blockSize: blockSize}, nil
	case "mooncake":
		s := uint64(0)
		if seed != "" {
			var err error
			if s, err = strconv.ParseUint(seed, 10, 64); err != nil {
				return nil, fmt.Errorf("%w: mooncake seed %q is not a decimal u64", ErrSeed, seed)
			}
		}
		return newMooncake(blockSize, s), nil
	case "vllm":
		spec = "vllm:sha256"
	}
	algo, ok := strings.CutPrefix(spec, "vllm:")
	if !ok {
		return nil, fmt.Errorf("%w: %q (want fnv, mooncake, vllm or vllm:ALGO)", ErrUnknownScheme, spec)
	}
	return newVLLM(algo, blockSize, seed)
}

// BytesID is the 64-bit id of a full block hash, as vLLM publishes it in
// KV events (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default): the hash
// read as a big-endian integer, modulo 2^64, i.e. its last 8 bytes. It lets
// a consumer of events that carry the hash bytes match them with Blocks.
func BytesID(hash []byte) uint64 {
	if len(hash) >= 8 {
		return binary.BigEndian.Uint64(hash[len(hash)-8:])
	}
	var id uint64
	for _, c := range hash {
		id = id<<8 | uint64(c)
	}
	return id
}

func validVLLMSeed(seed string) error {
	if len(seed) > maxSeedLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrSeed, len(seed), maxSeedLen)
	}
	if !utf8.ValidString(seed) {
		// An environment variable Python decoded would be valid text.
		return fmt.Errorf("%w: %q is not UTF-8", ErrSeed, seed)
	}
	return nil
}
