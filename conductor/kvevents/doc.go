// Package kvevents follows inference engines' KV-cache events: which
// blocks each engine's cache holds, as it publishes them, so that the
// Conductor's prefix index matches the engines' real cache state rather
// than its own guesses.
//
// The transport is vLLM's (also SGLang's, official Mooncake's master's
// and the KV Events API's): a ZeroMQ PUB socket sending three-frame
// messages [topic, sequence (u64, big-endian, from 0 per process),
// payload], and optionally a ROUTER socket that resends buffered messages
// from a sequence number on, ending with a sequence of -1. The payload is
// msgpack [timestamp, [event, ...], dp_rank]; Decode reads vLLM's events
// (BlockStored, BlockRemoved, AllBlocksCleared, as tagged maps or, from
// older versions, tagged arrays) and the KV Events API's (event_type
// stored, removed, cleared, with seq_hashes and the envelope fields).
//
// A Subscriber speaks ZMTP 3.0 itself (zmtp.go: greeting, NULL mechanism,
// READY, frames), with no cgo. It hands the batches of one publisher to a
// Handler in sequence order, each once:
//
//   - at its first connection, and after a reconnection, it asks the
//     replay socket for what was published before, so a Conductor started
//     after the engines still learns their caches (as far as the
//     publisher's replay buffer reaches);
//   - a gap in the sequence numbers is filled from the replay socket;
//     what cannot be filled resets the handler (the index drops that
//     publisher's blocks rather than keep ones it may have evicted);
//   - a sequence starting again at 0 is a restarted publisher: reset;
//   - a publisher unreachable for Config.DownAfter (killed: its TCP
//     connection drops at once, and redials are refused) is reset, so a
//     dead engine's blocks leave the index within DownAfter plus one
//     Retry.
//
// A publisher that restarts and comes back within DownAfter is seen as
// restarted only if its first message seen is sequence 0; an engine
// restart takes far longer than the default DownAfter (3 s). A publisher
// whose process hangs with its connection open is not detected here.
package kvevents
