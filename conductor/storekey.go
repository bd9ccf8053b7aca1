package conductor

import (
	"strconv"
	"strings"
)

// Store keys. The prefix index learns what the store holds from the
// master's watch of its keys (conductor/storefeed), so a key must say
// which block it holds. A key names a block when its last '@'-separated
// field (the whole key without one) is either
//
//   - the block's chained hash (HashTokens) as 16 lower-case hexadecimal
//     digits: BlockKey's form, "<model>@<rank>@<hash>" as KV connectors
//     name the chunks they store, the model and rank (or anything else
//     before the hash) being the writer's own;
//   - or "blk-" and the hash in decimal, without leading zeros: the trace
//     replay's keys (bench trace), whose hashes are the traces' hash_ids.
//
// Several keys may name one block (one per tensor-parallel rank, say): the
// store holds the block while it holds any of them. Other keys are not
// blocks and the feed ignores them.

// BlockKey is the store key of block h written under prefix (the model
// and rank, or empty): prefix@hhhhhhhhhhhhhhhh.
func BlockKey(prefix string, h uint64) string {
	hex := strconv.FormatUint(h, 16)
	var b strings.Builder
	b.Grow(len(prefix) + 17)
	if prefix != "" {
		b.WriteString(prefix)
		b.WriteByte('@')
	}
	for range 16 - len(hex) {
		b.WriteByte('0')
	}
	b.WriteString(hex)
	return b.String()
}

// KeyBlock is the block a store key names, and whether it names one.
func KeyBlock(key string) (uint64, bool) {
	f := key[strings.LastIndexByte(key, '@')+1:]
	if d, ok := strings.CutPrefix(f, "blk-"); ok {
		if d == "" || d[0] == '+' || d[0] == '-' || (d[0] == '0' && len(d) > 1) {
			return 0, false
		}
		if h, err := strconv.ParseUint(d, 10, 64); err == nil {
			return h, true
		}
		return 0, false
	}
	if len(f) != 16 {
		return 0, false
	}
	for i := range len(f) {
		if c := f[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return 0, false
		}
	}
	h, _ := strconv.ParseUint(f, 16, 64) // 16 hex digits fit
	return h, true
}
