// Package blockkey says which KV-cache block a store key names. The
// Conductor's prefix index (package conductor) and the master's KV events
// (store/master) both learn what the store holds from its keys, so both
// must read a key the same way; this leaf package is that one reading,
// importable by the master without the Conductor.
//
// A key names a block when its last '@'-separated field (the whole key
// without one) is either
//
//   - the block's chained hash as 16 lower-case hexadecimal digits: Key's
//     form, "<model>@<rank>@<hash>" as KV connectors name the chunks they
//     store, the model and rank (or anything else before the hash) being
//     the writer's own;
//   - or "blk-" and the hash in decimal, without leading zeros: the trace
//     replay's keys, whose hashes are the traces' hash_ids.
//
// SeqHash adds the forms official Mooncake's master reads for its KV
// events, where the whole key is the block's seq_hash: a decimal u64, or
// "0x" and a hexadecimal u64.
//
//	k := blockkey.Key("llama@0", 0xabc) // "llama@0@0000000000000abc"
//	h, ok := blockkey.Block(k)          // 0xabc, true
//	h, ok = blockkey.SeqHash("0x2a")    // 42, true
package blockkey

import (
	"strconv"
	"strings"
)

// Key is the store key of block h written under prefix (the model and
// rank, or empty): prefix@hhhhhhhhhhhhhhhh.
func Key(prefix string, h uint64) string {
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

// Block is the block a store key names in this project's forms (Key's and
// "blk-<decimal>"), and whether it names one.
func Block(key string) (uint64, bool) {
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

// SeqHash is the block a key names for a KV event, and whether it names
// one: Block's forms first, then the whole key as a decimal u64 or as
// "0x" (or "0X") and 1 to 16 hexadecimal digits of either case.
//
// Block goes first because a key of 16 decimal digits is ambiguous, and
// Key("", h) writes one whenever h's hex digits are all below a: read as
// decimal, the event would name another block than the Conductor's index
// reads from the same key.
func SeqHash(key string) (uint64, bool) {
	if h, ok := Block(key); ok {
		return h, true
	}
	if x, ok := strings.CutPrefix(key, "0x"); ok || strings.HasPrefix(key, "0X") {
		if !ok {
			x = key[2:]
		}
		if len(x) == 0 || len(x) > 16 {
			return 0, false
		}
		// Base 16 takes no sign or '_': digits only.
		return parse(x, 16)
	}
	if key == "" || key[0] < '0' || key[0] > '9' {
		return 0, false // ParseUint would take a '+'
	}
	return parse(key, 10)
}

// parse is strconv.ParseUint as (value, ok), 0 on any error (ParseUint
// answers the maximum on overflow).
func parse(s string, base int) (uint64, bool) {
	h, err := strconv.ParseUint(s, base, 64)
	if err != nil {
		return 0, false
	}
	return h, true
}
