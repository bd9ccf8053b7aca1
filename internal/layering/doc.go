// Package layering holds no code: its test enforces the import layering
// that docs/DESIGN.md §2 describes, so a stray import that would drag the
// master's server side into every client, and into libmooncake.so, fails
// `go test` instead of surfacing as a bigger binary.
//
// The rule it checks: the C library (capi) and the store client
// (store/client) link no master, HA or cluster code and no etcd server.
// The client's share of the master, the segment allocator its staging
// buffer uses, lives in the leaf package store/alloc for that reason.
package layering
