// Package router is the Conductor's HTTP front: an OpenAI-compatible
// server that runs every request in two steps, prefill on one inference
// instance and decode on another, with the KV cache moving between them
// through the instances' KV connectors (vLLM's disaggregated serving). The
// scheduler (package conductor) picks the pair; the router speaks HTTP to
// clients and engines and keeps the scheduler's load accounting exact.
//
//	sched, _ := conductor.New(conductor.Config{})
//	r, _ := router.New(router.Config{Scheduler: sched, Instances: []router.Instance{
//		{ID: "p0", Role: router.RolePrefill, URL: "http://10.0.0.1:8100", CacheBlocks: 4096},
//		{ID: "d0", Role: router.RoleDecode, URL: "http://10.0.0.2:8200"},
//	}})
//	defer r.Close()
//	http.ListenAndServe(":8000", r)
//
// `mooncake conductor` is this, with flags and a config file.
//
// # One request
//
// POST /v1/completions and /v1/chat/completions, streamed or not, go
// through four steps.
//
// Token ids. A completion prompt given as ids is used as is; text and chat
// messages go to an engine's POST /tokenize ({model, prompt} or {model,
// messages, chat template fields} -> {tokens}), the prefill instances
// first, trying up to three on failure. The ids are hashed into blocks
// (Config.BlockHash: by default conductor.HashTokens' 512-token blocks;
// with the engines' own hashing, e.g. vllm:sha256 and their block size,
// the keys their KV events name, so an instance's Instance.KVEvents feed
// the index through Config.Indexer), the keys of the prefix index. A batch of several prompts is refused (400): each prompt needs
// its own pair and its own KV transfer.
//
// Schedule. The scheduler gets {ID, prompt length, max_tokens, blocks} and
// answers a prefill and a decode instance, or a rejection (429). From here
// PrefillDone and DecodeDone are each called exactly once, whatever
// happens to the request, so no load leaks.
//
// Prefill. The client's body goes to the prefill instance with stream
// false, max_tokens 1 (max_completion_tokens 1 if set), without
// stream_options, min_tokens and min_completion_tokens, and with
//
//	"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
//	  "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
//	  "remote_port": null, "transfer_id": "<request id>"}
//
// The instance computes the prompt's KV and keeps it for the decode side.
// The kv_transfer_params of its answer (NIXL-style connectors:
// do_remote_prefill, remote_engine_id, remote_block_ids, remote_host,
// remote_port, ...) are what the decode instance needs. PrefillDone is
// called when the answer is in.
//
// Decode. The client's body goes to the decode instance unchanged but for
// kv_transfer_params: the prefill's answer verbatim or, when it had none
// (vLLM's MooncakeConnector, where the decode side pulls by transfer ID),
//
//	"kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
//	  "transfer_id": "<request id>", "remote_engine_id": Instance.EngineID,
//	  "remote_bootstrap_addr": Instance.Bootstrap}
//
// Its answer is relayed whole, or as server-sent events an event at a
// time, flushed as they come; the final data: [DONE] leaves once the
// request is counted. DecodeDone is called when the answer ends.
//
// All three engine calls carry the same X-Request-Id (the request ID,
// also the transfer ID and the scheduler's ID) and the client's
// Authorization. The client's answer has headers X-Request-Id,
// X-Conductor-Prefill and X-Conductor-Decode.
//
// # Failures
//
// Every request gets an answer; errors are OpenAI error bodies
// {"error": {"message", "type", "param", "code"}} with code the status:
//
//   - 400 malformed body or field (param names it), 413 body too large,
//     404 unknown route or instance, 405 wrong method, 409 duplicate
//     instance; an engine's own 4xx is passed on with its message.
//   - 429 admission control rejected the request.
//   - 503 nothing to route to.
//   - 502 an engine refused the connection, broke it, answered 5xx or
//     garbage; 504 it did not answer within Config.PrefillTimeout (tokenize,
//     prefill), Config.DecodeTimeout, or, on a stream, Config.IdleTimeout
//     between events.
//
// Once a stream has started, the status is sent: a decode that fails then
// (connection closed, silence, an end without "data: [DONE]") ends the
// stream with an error event, data: {"error": {...}}, and data: [DONE].
// A client that goes away cancels the engine call it was waiting on.
//
// # Other routes
//
//   - GET, POST /v1/instances; GET, DELETE /v1/instances/{id}: register
//     {id, role: prefill|decode, url, cache_blocks, engine_id,
//     bootstrap_addr} and unregister instances, in the router and the
//     scheduler together.
//   - POST /v1/index/query {tokens: [...]} or {hashes: [...]}: the longest
//     cached prefix per holder, {"blocks": n, "prefix_blocks": {"p0": 12,
//     "store": 3}}.
//   - with Config.Indexer: official Mooncake's indexer API, POST /register,
//     /unregister, /query, /query_by_hash, GET /services (package
//     conductor/indexer).
//   - GET /v1/models: an engine's answer.
//   - GET /health: readiness. 200 when a request can be routed, that is
//     when at least one prefill and one decode instance are reachable,
//     else 503, with the body {status: "ok"|"unavailable", ready,
//     prefill, decode (registered), reachable_prefill, reachable_decode,
//     unreachable: [{id, role, url, error}], inflight}. An instance is
//     reachable when its engine answers GET /health within
//     Config.ProbeTimeout with a status below 500 (a 404 or 401 still
//     serves; vLLM answers 503 once its engine died). Outcomes are reused
//     for Config.ProbeInterval, so polling costs the engines one probe per
//     interval; a newly registered instance is probed at once. Use it as
//     a readiness probe; a liveness probe should not, or it restarts the
//     router whenever the engines are down.
//   - GET /metrics: mooncake_conductor_requests_total{route,outcome},
//     _rejected_total, _ttft_seconds (arrival to the first event relayed;
//     streams only), _e2e_seconds, _prefill_seconds{instance},
//     _engine_errors_total{instance,phase}, _inflight_requests,
//     _instances{role}, _reused_blocks_total, and, with a scheduler that
//     has ReplicaHistogram (conductor.Scheduler),
//     _block_replicas{replicas="1|2|3|4+"}: the index's blocks by the
//     prefill instances holding them, as of the scrape.
package router
