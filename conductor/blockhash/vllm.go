package blockhash

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/zeebo/xxh3"
)

// defaultNoneHashSeed is the seed vLLM derives NONE_HASH from when
// PYTHONHASHSEED is unset and the algorithm is cryptographic.
const defaultNoneHashSeed = "vllm-none-hash"

// vllmAlgos are vLLM's --prefix-caching-hash-algo values: how the hash
// input is serialised (pickle protocol 5 or canonical CBOR) and digested
// (SHA-256, 32 bytes, or XXH3-128, 16 bytes).
var vllmAlgos = map[string]struct{ cbor, xxhash bool }{
	"sha256":      {},
	"sha256_cbor": {cbor: true},
	"xxhash":      {xxhash: true},
	"xxhash_cbor": {cbor: true, xxhash: true},
}

// vllmScheme is vLLM's prefix-caching block hash:
//
//	hash[i] = H((hash[i-1], tuple(block i's tokens), None))
//	hash[-1] = NONE_HASH = H(seed)
//
// where H serialises its argument and digests it; the id vLLM publishes in
// KV events is BytesID(hash[i]). The None is the block's extra keys, which
// BlocksExtra fills in for LoRA adapters and cache_salt; multimodal inputs
// and prompt embeddings, also extra keys, are not covered.
type vllmScheme struct {
	algo         string
	blockSize    int
	cbor, xxhash bool
	none         digest
	// scratch holds *[]byte message buffers big enough for one block, so
	// that Blocks allocates nothing once the pool is warm.
	scratch sync.Pool
}

var _ ExtraScheme = (*vllmScheme)(nil)

// digest is a block hash: the first n bytes of b.
type digest struct {
	b [sha256.Size]byte
	n int
}

func (d *digest) bytes() []byte { return d.b[:d.n] }

func newVLLM(algo string, blockSize int, seed string) (*vllmScheme, error) {
	a, ok := vllmAlgos[algo]
	if !ok {
		return nil, fmt.Errorf("%w: vllm:%s (want sha256, sha256_cbor, xxhash or xxhash_cbor)", ErrUnknownScheme, algo)
	}
	if !a.cbor && blockSize > MaxPickleBlockSize {
		return nil, fmt.Errorf("%w: %d for vllm:%s (at most %d: larger blocks need a second pickle frame)",
			ErrBlockSize, blockSize, algo, MaxPickleBlockSize)
	}
	if seed == "" {
		if a.xxhash {
			return nil, fmt.Errorf("%w: vllm:%s needs the engine's PYTHONHASHSEED (without it vLLM seeds xxhash randomly per process)",
				ErrSeed, algo)
		}
		seed = defaultNoneHashSeed
	}
	if err := validVLLMSeed(seed); err != nil {
		return nil, err
	}
	s := &vllmScheme{algo: algo, blockSize: blockSize, cbor: a.cbor, xxhash: a.xxhash}
	var msg []byte
	if s.cbor {
		msg = cborString(nil, seed)
	} else {
		msg = pickleString(nil, seed)
	}
	s.none = s.digest(msg)
	size := maxPickleBlock(blockSize)
	if s.cbor {
		size = maxCBORBlock(blockSize)
	}
	s.scratch.New = func() any {
		b := make([]byte, 0, size)
		return &b
	}
	return s, nil
}

func (s *vllmScheme) BlockSize() int { return s.blockSize }

func (s *vllmScheme) String() string { return "vllm:" + s.algo }

func (s *vllmScheme) Blocks(dst []uint64, tokens []int) []uint64 {
	return s.BlocksExtra(dst, tokens, Extra{})
}

// BlocksExtra is Blocks for a request that carries x: its LoRA key goes
// into every block, its cache_salt into the first, as vLLM's
// generate_block_hash_extra_keys puts them. Extras over MaxExtraLen
// bytes, or not UTF-8, give no ids (Extra.Validate says why): no prefix
// then matches, which is what a miss costs.
func (s *vllmScheme) BlocksExtra(dst []uint64, tokens []int, x Extra) []uint64 {
	if x.Validate() != nil {
		return dst
	}
	dst = slices.Grow(dst, len(tokens)/s.blockSize)
	s.walk(tokens, x, func(d digest) { dst = append(dst, BytesID(d.bytes())) })
	return dst
}

// walk calls visit with the hash of each full block of tokens, in order.
// visit takes a copy: a pointer would make the parent escape to the heap.
func (s *vllmScheme) walk(tokens []int, x Extra, visit func(digest)) {
	if len(tokens) < s.blockSize {
		return
	}
	bp := s.scratch.Get().(*[]byte)
	defer s.scratch.Put(bp)
	parent := s.none
	first, rest := x.keys(true), x.keys(false)
	for i := 0; i+s.blockSize <= len(tokens); i += s.blockSize {
		block := tokens[i : i+s.blockSize]
		keys := rest
		if i == 0 {
			keys = first
		}
		if s.cbor {
			*bp = cborBlock((*bp)[:0], parent.bytes(), block, keys)
		} else {
			*bp = pickleBlock((*bp)[:0], parent.bytes(), block, keys)
		}
		parent = s.digest(*bp)
		visit(parent)
	}
}

func (s *vllmScheme) digest(msg []byte) digest {
	if s.xxhash {
		// Python's xxh3_128_digest is the canonical big-endian form,
		// high half first, which is what Uint128.Bytes returns.
		var d digest
		h := xxh3.Hash128(msg).Bytes()
		d.n = copy(d.b[:], h[:])
		return d
	}
	return digest{b: sha256.Sum256(msg), n: sha256.Size}
}

// Pickle protocol 5, byte for byte as CPython's pickle.dumps writes the
// shapes vLLM hashes: a str (the seed) and (bytes, tuple of ints, extra
// keys), the extra keys None or a tuple of tuples of str.
// One frame covers the whole message (see MaxPickleBlockSize).
const (
	pkProto          = 0x80
	pkFrame          = 0x95
	pkShortBinUni    = 0x8c
	pkBinUnicode     = 'X'
	pkShortBinBytes  = 'C'
	pkMemoize        = 0x94
	pkMark           = '('
	pkTuple          = 't'
	pkTuple1         = 0x85
	pkBinInt1        = 'K'
	pkBinInt2        = 'M'
	pkBinInt         = 'J'
	pkLong1          = 0x8a
	pkNone           = 'N'
	pkStop           = '.'
	pkFrameHeaderLen = 11 // PROTO 5, FRAME, 8-byte frame length
)

// maxPickleBlock bounds pickleBlock's output for blockSize tokens: header,
// a 32-byte parent, at most 10 bytes a token (LONG1 of 8 bytes) and 6 bytes
// of opcodes around them.
func maxPickleBlock(blockSize int) int {
	return pkFrameHeaderLen + 2 + sha256.Size + 3 + 10*blockSize + 6
}

func pickleStart(b []byte) []byte {
	return append(b, pkProto, 5, pkFrame, 0, 0, 0, 0, 0, 0, 0, 0)
}

// pickleEnd writes STOP and fills in the frame length of the message that
// pickleStart began at b[start:].
func pickleEnd(b []byte, start int) []byte {
	b = append(b, pkStop)
	binary.LittleEndian.PutUint64(b[start+3:], uint64(len(b)-start-pkFrameHeaderLen))
	return b
}

func pickleString(b []byte, s string) []byte {
	start := len(b)
	b = pickleStart(b)
	b = pickleStr(b, s)
	return pickleEnd(b, start)
}

// pickleStr appends a str inside a message, memoized as every str is.
func pickleStr(b []byte, s string) []byte {
	if len(s) < 256 {
		b = append(b, pkShortBinUni, byte(len(s)))
	} else {
		b = append(b, pkBinUnicode)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	}
	b = append(b, s...)
	return append(b, pkMemoize)
}

// pickleKeys appends a block's extra keys: None, or a tuple of up to three
// tuples of two or three strs (Extra.keys).
func pickleKeys(b []byte, keys [][]string) []byte {
	if len(keys) == 0 {
		return append(b, pkNone)
	}
	for _, k := range keys {
		for _, s := range k {
			b = pickleStr(b, s)
		}
		b = append(b, pkTuple1+byte(len(k)-1), pkMemoize)
	}
	return append(b, pkTuple1+byte(len(keys)-1), pkMemoize)
}

// pickleBlock appends pickle.dumps((parent, tuple(tokens), keys), 5) for
// a block of at least one token (an empty tuple would be EMPTY_TUPLE, not
// memoized). Python memoizes the bytes and both tuples, never ints; tuples
// of up to three items have their own opcodes.
func pickleBlock(b []byte, parent []byte, tokens []int, keys [][]string) []byte {
	start := len(b)
	b = pickleStart(b)
	b = append(b, pkShortBinBytes, byte(len(parent)))
	b = append(b, parent...)
	b = append(b, pkMemoize)
	switch n := len(tokens); {
	case n <= 3:
		b = pickleInts(b, tokens)
		b = append(b, pkTuple1+byte(n-1), pkMemoize)
	default:
		b = append(b, pkMark)
		b = pickleInts(b, tokens)
		b = append(b, pkTuple, pkMemoize)
	}
	b = pickleKeys(b, keys)
	b = append(b, pkTuple1+2, pkMemoize)
	return pickleEnd(b, start)
}

// pickleInts appends pickleInt of each token. It is the hot loop of the
// pickle schemes, so it writes in place into room reserved up front (the
// 4-byte store of a short int spills into that room harmlessly) instead
// of appending byte by byte.
func pickleInts(b []byte, tokens []int) []byte {
	n := len(b)
	b = slices.Grow(b, 10*len(tokens)+4)
	w := b[:cap(b)]
	for _, t := range tokens {
		v := int64(t)
		if v < 0 || v > math.MaxInt32 {
			n += copy(w[n:], pickleInt(w[n:n], t))
			continue
		}
		binary.LittleEndian.PutUint32(w[n+1:], uint32(v))
		switch {
		case v <= 0xff:
			w[n] = pkBinInt1
			n += 2
		case v <= 0xffff:
			w[n] = pkBinInt2
			n += 3
		default:
			w[n] = pkBinInt
			n += 5
		}
	}
	return w[:n]
}

// pickleInt appends an int the way CPython's save_long does: the shortest
// of BININT1 (0..255), BININT2 (..65535), BININT (signed 32 bits), else
// LONG1 with the shortest little-endian two's complement.
func pickleInt(b []byte, t int) []byte {
	v := int64(t)
	switch {
	case v >= 0 && v <= 0xff:
		return append(b, pkBinInt1, byte(v))
	case v >= 0 && v <= 0xffff:
		return append(b, pkBinInt2, byte(v), byte(v>>8))
	case v >= -1<<31 && v < 1<<31:
		return append(b, pkBinInt, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	}
	n := 8
	// Drop a top byte that only repeats the sign of the one below it.
	for n > 1 {
		top, next := byte(v>>(8*(n-1))), byte(v>>(8*(n-2)))
		if (top != 0 || next&0x80 != 0) && (top != 0xff || next&0x80 == 0) {
			break
		}
		n--
	}
	b = append(b, pkLong1, byte(n))
	for i := range n {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}

// Canonical CBOR (RFC 8949 deterministic encoding), as cbor2.dumps(obj,
// canonical=True) writes vLLM's shapes: a tuple is an array, ints are
// major types 0/1 with the shortest argument, None is the simple value null.
const (
	cborUint   = 0 << 5
	cborNegInt = 1 << 5
	cborBytes  = 2 << 5
	cborText   = 3 << 5
	cborArray  = 4 << 5
	cborNull   = 0xf6
)

// maxCBORBlock bounds cborBlock's output: 9 bytes at most per head.
func maxCBORBlock(blockSize int) int { return 1 + 2 + sha256.Size + 9 + 9*blockSize + 1 }

func cborHead(b []byte, major byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(b, major|byte(v))
	case v <= 0xff:
		return append(b, major|24, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, major|25), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, major|26), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, major|27), v)
}

func cborString(b []byte, s string) []byte {
	return append(cborHead(b, cborText, uint64(len(s))), s...)
}

// cborBlock appends cbor2.dumps((parent, tuple(tokens), keys),
// canonical=True): keys null, or an array of arrays of text.
func cborBlock(b []byte, parent []byte, tokens []int, keys [][]string) []byte {
	b = append(b, cborArray|3)
	b = append(cborHead(b, cborBytes, uint64(len(parent))), parent...)
	b = cborHead(b, cborArray, uint64(len(tokens)))
	for _, t := range tokens {
		if t >= 0 {
			b = cborHead(b, cborUint, uint64(t))
		} else {
			// CBOR's negative n stands for -1-n; ^t is -1-t.
			b = cborHead(b, cborNegInt, uint64(^t))
		}
	}
	if len(keys) == 0 {
		return append(b, cborNull)
	}
	b = cborHead(b, cborArray, uint64(len(keys)))
	for _, k := range keys {
		b = cborHead(b, cborArray, uint64(len(k)))
		for _, s := range k {
			b = cborString(b, s)
		}
	}
	return b
}
