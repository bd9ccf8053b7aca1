// Package trace replays the conversation trace of the Mooncake paper
// (FAST'25) through a KV-cache store and reports how much of the prefill
// the store saved.
//
// The trace (embedded: Conversation; or Load a file of the same JSON Lines)
// has one request per line: an arrival time, prompt and output lengths,
// and the prompt's blocks of 512 tokens as hash ids. The ids are chained,
// as prefix caching keys them: block i's id stands for tokens 0..512(i+1),
// so a request can reuse only a leading run of stored blocks.
//
// For each request, in trace order, a worker does what a prefill node does
// with the store, through the Store interface:
//
//  1. BatchExist on the prompt's block keys (KeyPrefix + hash id); the
//     stored prefix is the leading run of keys found;
//  2. BatchGet of that prefix, each block checked byte for byte against
//     its payload, a function of its hash id; the first block that fails
//     or differs ends the prefix actually hit, and a block that differs
//     is counted corrupt and makes Replay fail once it is done;
//  3. BatchPut of the blocks from there on that the store lacks, as the
//     prefill computed them.
//
// The yardstick is the infinite-cache bound, computed from the trace
// alone: the hit ratio of a store that keeps every block, with requests
// replayed one at a time. A store with room for everything and
// Concurrency 1 reaches it exactly; eviction lowers the hit ratio, and so
// can concurrency (a request may look up blocks an earlier one is still
// writing). Concurrent requests can also write the same new block: a Store
// over a store that refuses a second put of a key should report that as
// success, since the block is there.
//
// Blocks are scaled down: a real block of LLaMA3-70B in fp16 is 160 MiB
// (RealBlockBytes), and the conversation trace has 288,500 of them, 183,000
// distinct; the default BlockBytes is 64 KiB, which writes about 12 GB.
//
// Replay returns per-request figures (RequestResult) and their sums
// (Result); WriteTable prints the summary, WriteParquet writes one row per
// request, WritePlot draws the hit ratio and the get latency as a PNG and
// an SVG. With Options.Progress set, a bar (on a terminal) or a periodic
// line shows the replay's progress. The bar is
// github.com/schollz/progressbar's (width, count, time left); the
// periodic line is ours, since progressbar has no mode for a writer that
// is not a terminal, and a log or a pipe wants whole lines, not a bar
// redrawn over itself.
//
//	res, err := trace.Replay(ctx, store, trace.Options{Speedup: 10, Progress: os.Stderr})
//	if err != nil {
//		return err
//	}
//	res.WriteTable(os.Stdout)
//	return trace.WriteParquet("replay.parquet", res.PerRequest)
package trace
