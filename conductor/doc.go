// Package conductor is Mooncake's global scheduler (FAST'25 §4): for each
// request it picks a prefill instance and a decode instance so that the
// KV cache already computed somewhere is reused, the load stays balanced,
// and the latency objectives hold; requests predicted to break them are
// rejected early.
//
// The Scheduler keeps three things:
//
//   - a prefix index (Index): chained block hash -> the holders that have
//     the block, the prefill instances' local caches and the store, each
//     an LRU bounded by its capacity. Routing decisions feed it (the
//     chosen instance will hold the prompt's blocks), so do the store's
//     put and evict events (StoreAdded, StoreEvicted: conductor/storefeed
//     watches the store master and names blocks by their keys, BlockKey
//     and KeyBlock) and the engines' KV events where they publish them
//     (KVEventSink: conductor/indexer follows vLLM's and the masters' ZMQ
//     events into it; with Config.BlockTokens the engines' block size and
//     Request.Blocks their own block ids, conductor/blockhash, the
//     scheduler routes on what the engines really hold);
//   - per prefill instance, the queue of predicted prefill times;
//   - per decode instance, the requests assigned to it, to predict its
//     batch when a new request would join.
//
// Prefill selection follows the paper's Algorithm 1 (Policy
// GlobalCacheAware): for every prefill instance, TTFT = the transfer time
// of the prefix it lacks (only when the best prefix elsewhere is longer by
// more than Config.BalanceBlocks; Config.Bandwidth) + its queue time + the
// predicted prefill time of the new tokens (PrefillModel, a polynomial in
// the prompt and prefix lengths); the least TTFT wins. When the winner
// pulls a prefix, it keeps the blocks, so hot prefixes gain replicas on
// the instances load pushes them to, with no forecast of usage;
// Scheduler.Replicas and Scheduler.ReplicaHistogram count the copies (the
// router exports them as mooncake_conductor_block_replicas, the simulator
// samples them over time). Decode selection takes the least predicted
// time between tokens (DecodeModel, a continuous-batching iteration
// model). Admission (Config.Admission)
// rejects a request whose predicted TTFT, or whose TBT predicted for the
// time it reaches decode, breaks its SLO; the naive variant that looks at
// the current decode load is there for comparison. The other policies of
// the paper's Fig. 5 (LocalCacheAware, LoadBalance, Random) are there as
// baselines.
//
// Times are durations since an epoch the caller picks: the router's start,
// or the simulator's virtual clock (conductor/sim). The lifecycle of a
// request is Schedule, then PrefillDone when its first token is out and
// its KV cache has reached the decode instance, then DecodeDone when it
// finishes (or fails):
//
//	s, err := conductor.New(conductor.Config{})
//	if err != nil {
//		return err
//	}
//	s.Add(conductor.Instance{ID: "p0", Role: conductor.Prefill, CacheBlocks: 6000})
//	s.Add(conductor.Instance{ID: "d0", Role: conductor.Decode})
//	d, err := s.Schedule(now(), conductor.Request{ID: "r1", Tokens: len(prompt),
//		Output: 256, Blocks: conductor.HashTokens(prompt)})
//	if errors.Is(err, conductor.ErrRejected) {
//		return tooManyRequests(err) // HTTP 429
//	}
//	// ... prefill on d.Prefill, pulling d.Pulled blocks from d.Source ...
//	s.PrefillDone(now(), "r1")
//	// ... decode on d.Decode ...
//	s.DecodeDone(now(), "r1")
//
// The default time models are derived from first principles for
// LLaMA3-70B on 8xA800 nodes, the paper's setup; model.go and docs/sim.md
// give the derivation.
//
// A decision costs one index lookup per prompt block for the prefix pass
// and one more per block to record the prompt on the chosen instance
// (none when the pass found the block), plus a pass over the instances
// and over the requests on the decode instances; in a steady state it
// allocates nothing. BenchmarkSchedule (64 prefill and 64 decode
// instances, the index warmed by the conversation trace) reports its p50
// and p99.
package conductor
