// Package blockhash computes the 64-bit identities of a prompt's full KV
// blocks the way inference engines and Mooncake's KV Events API compute
// them, so that the Conductor can look a prompt up in an index fed by the
// engines' KV events: the ids it computes from the prompt's token ids are
// the ids the engines published for the blocks they hold.
//
// Every scheme chains: block i's id depends on the tokens of blocks 0..i,
// so two prompts share block i's id only if they share their first
// (i+1)*BlockSize tokens, and the ids of a prefix are a prefix of the ids.
// Only full blocks have ids; a trailing partial block is never cached or
// published as a whole.
//
// # Schemes
//
// A scheme is named by a spec (see Parse) and must match what the engine
// behind an index publishes, with the same block size and seed:
//
//   - "vllm:sha256" (also "vllm"): vLLM's default prefix-caching hash,
//     SHA-256 of pickle.dumps((parent, tuple(tokens), None), protocol=5),
//     with parent = NONE_HASH = SHA-256 of the pickled seed for block 0.
//     The seed is the engine's PYTHONHASHSEED, or "vllm-none-hash" when it
//     is unset. The published id is the hash's last 8 bytes, big-endian
//     (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default); BytesID turns
//     hash bytes, as published with that variable at 0, into the same id.
//   - "vllm:sha256_cbor", "vllm:xxhash", "vllm:xxhash_cbor": vLLM's other
//     --prefix-caching-hash-algo values: canonical CBOR instead of pickle,
//     XXH3-128 instead of SHA-256. The xxhash ones need the engine's
//     PYTHONHASHSEED: without it vLLM seeds them randomly per process and
//     its block ids cannot be reproduced elsewhere.
//   - "mooncake": the standard hash of Mooncake's KV Events API (the
//     official Conductor's indexer), for publishers that send seq_hashes
//     without token ids: XXH3-64 with seed S over each block's tokens as
//     little-endian u32, rolled as seq_hash[i] = XXH3-64(seq_hash[i-1] ||
//     local[i], S).
//   - "fnv": this project's own FNV-1a chain (conductor.HashTokens at
//     512-token blocks), which the traces' hash_ids and the simulator use.
//
// A request's extras go where vLLM puts them, in place of None: its LoRA
// adapter, ("lora", name, path), in every block, and its cache_salt,
// ("cache_salt", salt), in the first (ExtraScheme.BlocksExtra, Extra,
// BlocksFor). Multimodal inputs and prompt embeddings, vLLM's other extra
// keys, are not covered: such a request's blocks get ids no engine
// publishes, so it finds no cached prefix and is never misrouted. The one
// place this differs from pickle is a LoRA name and path that are the same
// Python object (pickle then refers back to the name). The block size is
// the one vLLM hashes at: its block_size (times the decode context
// parallel size under DCP), except in models with several KV cache groups,
// where it hashes at the GCD of their block sizes (or prefix_match_unit)
// and a group whose blocks are k times larger publishes, for each of its
// blocks, the id of the last of the k hashed blocks in it: every k-th id of
// Blocks. The pickle schemes accept blocks of up to MaxPickleBlockSize
// tokens.
//
// # Correctness
//
// e2e/vllm/gen_block_hashes.py writes the testdata vectors: the vLLM
// schemes' from vLLM's own functions, the others' from Python's xxhash and
// a Python FNV-1a. The tests compare every hash byte and id, for every
// scheme, several seeds and the edges of each encoding.
//
// # Cost
//
// Blocks allocates nothing beyond the growth of dst: scratch buffers come
// from a sync.Pool, which also makes every Scheme safe for concurrent use.
// vllm:sha256 costs about 1.2-1.5x plain SHA-256 over the same pickled
// bytes (BenchmarkBlocks, blocks of 16 and 128); the rest is serialisation.
package blockhash
