// Package master is the Mooncake Store master: the metadata service that
// clients talk to over gRPC (store/storepb). It owns the map from object keys
// to replicas, allocates replica space in the DRAM segments that clients
// mount into the pool, grants leases on reads, evicts near-LRU objects past
// a high watermark, and keeps one leader among several masters through
// etcd. It is never in the data path: clients move bytes with the Transfer
// Engine between each other's segments, at the offsets the master handed
// out.
//
// So far: the allocator, the metadata service (Service: segments,
// put/get/upsert/remove, leases, soft pins, eviction, client expiry) and its
// gRPC front (GRPCServer). The client, the SSD tier and HA come next.
//
// # Allocator
//
// An Allocator manages the offsets [0, size) of one mounted segment; the
// master adds the segment's base address. It is a two-level segregated fit
// over floating-point size classes (16 per power of two) with immediate
// coalescing, so Alloc and Free are O(1) and equal-size KV blocks reuse
// holes of exactly their size:
//
//	a, _ := master.NewAllocator(64 << 30) // 64 GiB segment, 64-byte alignment
//	off, ok := a.Alloc(512 << 10)         // ok=false: no room, evict and retry
//	addr := seg.Base + off                // what the client writes to
//	_ = a.Free(off)                       // on remove or eviction
//
// An Allocator is not safe for concurrent use; the master serialises the
// calls on each segment.
package master
