// Package alloc hands out ranges of one memory segment: an O(1) two-level
// segregated fit (TLSF) over floating-point size classes, 16 per power of
// two, with immediate coalescing, so equal-size KV blocks reuse holes of
// exactly their size. The master allocates replica space in every mounted
// segment with it; a client allocates its registered staging buffer with
// it.
//
// It is a leaf: it imports only the standard library, so a client (and
// libmooncake.so) that needs an allocator does not link the master's
// server, journal and HA code (internal/layering enforces this).
//
// An Allocator manages the offsets [0, size); its user adds the segment's
// base address:
//
//	a, _ := alloc.New(64 << 30)   // 64 GiB segment, 64-byte alignment
//	off, ok := a.Alloc(512 << 10) // ok=false: no room, evict and retry
//	addr := seg.Base + off        // what the client writes to
//	_ = a.Free(off)               // on remove or eviction
//
// Restore rebuilds an allocator from the spans still allocated, as a new
// master leader does from its journal. An Allocator is not safe for
// concurrent use.
package alloc
