package conductor

import (
	"errors"
	"time"
)

// BlockTokens is the number of tokens in one KV-cache block: the unit the
// prefix index, the store and the FAST'25 traces (hash_ids) count in.
const BlockTokens = 512

// Role says which pool an instance serves.
type Role uint8

// Instance roles.
const (
	Prefill Role = iota + 1
	Decode
)

// Instance is one inference engine instance the conductor schedules onto.
type Instance struct {
	// ID names the instance; unique among the registered ones.
	ID string
	// Role is Prefill or Decode.
	Role Role
	// CacheBlocks bounds the instance's local prefix cache (prefill
	// instances), in blocks; the index keeps it LRU. Zero: no local cache.
	CacheBlocks int
	// Events says that the instance's KV-cache events feed the index
	// (BlockStored, BlockRemoved): its cache is what they say, and routing
	// decisions do not add the prompts they send it, which would leave
	// blocks the engine never stored (or already evicted) in the index.
	Events bool
}

// Request is what the scheduler needs to know of one inference request.
type Request struct {
	// ID names the request in PrefillDone and DecodeDone.
	ID string
	// Tokens is the prompt length.
	Tokens int
	// Output is the expected number of output tokens (max_tokens).
	Output int
	// Blocks are the chained hashes of the prompt's blocks, in order
	// (HashTokens; the traces' hash_ids).
	Blocks []uint64
}

// Decision is where a request goes and what the scheduler predicts for it.
type Decision struct {
	// Prefill and Decode are the chosen instances' IDs.
	Prefill, Decode string
	// Reused is the number of prefix blocks the prefill instance reuses:
	// held locally or pulled.
	Reused int
	// Pulled of them are transferred from Source (an instance ID or
	// StoreHolder) before prefill; Source is empty when Pulled is zero.
	Pulled int
	Source string
	// TTFT and TBT are the predicted time to first token and time between
	// tokens.
	TTFT, TBT time.Duration
}

// StoreHolder is the holder name of the global store in the prefix index.
const StoreHolder = "store"

// ErrRejected is wrapped by the error Schedule returns when admission
// control rejects a request (the router answers HTTP 429).
var ErrRejected = errors.New("conductor: rejected")
