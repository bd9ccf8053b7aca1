package conductor

import "github.com/mooncake-go/mooncake/internal/blockkey"

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
// blocks and the feed ignores them. The reading lives in internal/blockkey,
// which the master's KV events share.

// BlockKey is the store key of block h written under prefix (the model
// and rank, or empty): prefix@hhhhhhhhhhhhhhhh.
func BlockKey(prefix string, h uint64) string { return blockkey.Key(prefix, h) }

// KeyBlock is the block a store key names, and whether it names one.
func KeyBlock(key string) (uint64, bool) { return blockkey.Block(key) }
