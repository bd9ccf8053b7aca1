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
//   - at every connection it asks the replay socket for the publisher's
//     history: at the first, so a Conductor started after the engines
//     still learns their caches (as far as the replay buffer reaches);
//     after a reconnection, it looks there for the last batch it applied,
//     byte for byte: found, the publisher is the same process and only
//     the batches after it are applied; not found, the publisher
//     restarted (or the batches missed are gone from its buffer), and
//     the handler is reset and fed the history;
//   - a gap in the sequence numbers is filled from the replay socket;
//     what cannot be filled resets the handler (the index drops that
//     publisher's blocks rather than keep ones it may have evicted);
//   - without a replay socket, a first batch of a connection numbered 0
//     is a restarted publisher: reset (within one connection, a batch
//     already applied is a duplicate, never a restart);
//   - a publisher unreachable for Config.DownAfter (killed: its TCP
//     connection drops at once, and redials are refused) is reset, so a
//     dead engine's blocks leave the index within DownAfter plus one
//     Retry.
//
// A publisher whose process hangs with its connection open is not
// detected here.
package kvevents
