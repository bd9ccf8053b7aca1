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
// ("lanes") per peer. All lanes of a peer pull slices from one bounded
// queue, each lane pipelines a few requests before waiting for their status
// frames, and a slice that died with its connection is retried on another
// lane, a bounded number of times, within its deadline. Every slice sent is
// itself a valid Mooncake v2 request, so an official engine can serve us
// and we can serve it.
package tcp
