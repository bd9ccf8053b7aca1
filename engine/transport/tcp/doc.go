// Package tcp is the TCP data plane of the Transfer Engine, wire-compatible
// with Mooncake's TCP transport, protocol version 2 (see wire.go for the
// byte layout).
//
// The serving side (Server) answers READ and WRITE requests against
// registered memory, checking every range before touching it and moving
// payload straight between the socket and that memory. A rejected v2 WRITE
// has its payload drained so the connection stays in step; v1 has no way to
// refuse but hanging up.
//
// The initiating side (Client) keeps a few persistent connections
// ("lanes") per peer. Every slice sent is itself a valid Mooncake v2
// request, so an official engine can serve us and we can serve it. A slice
// takes one of two paths:
//
//   - Queued (Peer.Submit): all lanes of a peer pull slices from one bounded
//     queue. A lane's goroutine writes up to 16 queued requests with one
//     writev and keeps up to Depth on the wire; a reader goroutine per
//     connection reads their status frames and payloads in wire order. A
//     slice that died with its connection is retried on another lane, a
//     bounded number of times, within its deadline. Deep queues take this
//     path.
//   - Inline (Peer.SubmitInline, used by the engine for the slices of a
//     Submit that all go to one peer; v2 only): when they are few and small
//     (16 slices, 4 MiB), the queue is empty and a lane idles (its lock is free
//     and nothing is unanswered on its connection), the submitting goroutine
//     writes the requests itself, with one writev, and parks the slices on
//     the connection. Their waiter (Engine.Wait, through Inline.Wait) then
//     reads the answers in its own goroutine: requests and answers cost no
//     goroutine hand-off, as with a blocking socket. Each hand-off readies a
//     goroutine, which on a host with few cores wakes a second scheduler
//     thread that competes with the peer for the CPU: a lone 1 MiB READ took
//     twice as long that way. Parked answers are read by the lane's reader
//     instead when the submitter polls (Inline.Release), when its waiter's
//     context ends (the rest of a half-read answer included), or when the
//     lane sends more requests behind them; one lock per connection (rmu)
//     keeps a single reader on the socket and the answers in order.
//
// Paths. A peer may publish several addresses (a host with several NICs),
// and this side may dial from several (ClientConfig.LocalAddrs): every
// pairing is a path. Lanes start on the home paths (local i to peer
// address i when both have as many) and move to the others when a dial
// fails or a connection dies. With more than one path, each connection
// carries TCP_USER_TIMEOUT and keepalives of about PathTimeout, so the
// kernel fails one whose link went silent instead of leaving its slices
// to their deadline: the path is passed over for a while, the peer's
// other connections on it are cut, their slices retried on the rest, and
// while every path is down slices fail at once with the last reason. A
// peer with a single path behaves as before: a silent link is waited for
// until the slice deadline.
//
// Deadlines bound every read and write on both sides, but are moved lazily
// (see deadline.go): arming a runtime timer per request also woke a
// scheduler thread. An I/O that times out before its own deadline resumes
// where it stopped. Our server keeps a stream in step after refusing a
// request; Mooncake's hangs up, and the requests behind the refused one are
// sent again elsewhere without counting a retry.
package tcp
