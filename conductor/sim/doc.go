// Package sim is a discrete-event simulator of the Conductor (FAST'25 §4)
// on a request trace: it replays the trace's arrivals over modelled prefill
// and decode instances of LLaMA3-70B on 8xA800 nodes and reports what each
// request saw, so that the scheduler's policies can be compared, and the
// paper's findings reproduced, without a GPU.
//
// What is simulated, on a virtual clock (Config says how much of each):
//
//   - P prefill instances, each a FIFO of prefills with a local prefix
//     cache of a capacity in tokens, kept LRU, and optionally a shared
//     store every prefill writes its blocks to;
//   - for each prefill, the pull of the prefix the scheduler planned to
//     reuse from elsewhere (what the source still holds of it), at the
//     configured bandwidth, then the computation of the rest
//     (conductor.PrefillModel);
//   - the KV cache streamed layer by layer to the decode instance, which
//     runs continuous batching: a request joins the batch at an iteration
//     boundary when its KV cache fits in HBM, and every iteration
//     (conductor.DecodeModel) gives each request in it one token;
//   - or, for the coupled baseline, instances that run both stages in one
//     batch as vLLM does without disaggregation: a prompt's prefill is an
//     iteration of its own that stalls every decode there, or, with
//     chunked prefill, a chunk added to each iteration.
//
// The disaggregated policies are decided by the real conductor.Scheduler,
// called with the simulated time: Schedule on arrival (a rejection is the
// request's outcome), PrefillDone when its KV cache reaches decode,
// DecodeDone when it finishes, and the caches' blocks and evictions as
// engine and store events. Its predictions and the simulated execution
// use the same time models but are kept apart: the scheduler's index and
// queues are its own view, which drifts from the caches and queues the
// simulation runs, as it would from a real cluster's.
//
// A run is deterministic: a function of the Config (Seed included) and the
// trace. Each request is either rejected or completed; Outcome records its
// TTFT, its TBT as the paper measures it (the mean of the longest 10% of
// its token intervals, §5.1), its reused prefix and its instances. Result
// summarises them (Summary, Effective) and writes them as Parquet; the
// plots are PNG. A disaggregated run also samples the replicas of the
// scheduler's index every Config.ReplicaInterval of simulated time
// (Result.Replicas: blocks by number of prefill instances holding them,
// the hot blocks' mean replicas), written as CSV (WriteReplicasCSV) and
// drawn over time (PlotReplicas).
//
//	res, err := sim.Run(sim.Config{Policy: conductor.GlobalCacheAware, RateScale: 1.5},
//		trace.Conversation())
//	if err != nil {
//		return err
//	}
//	fmt.Println(res.Summary().TTFTMeanS)
//	return res.WriteParquet("sim.parquet")
//
// Fig5, Fig9, Fig10 and Fig1 regenerate the paper's figures on a trace;
// `mooncake sim` runs them, and docs/sim.md derives the time models.
package sim
