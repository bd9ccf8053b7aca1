// Package client is the Mooncake Store client. A client contributes a
// segment of DRAM to the pool (optionally also an SSD tier), and puts and
// gets objects: metadata goes to the master over gRPC (its unary calls as
// frames on the same port, internal/framerpc, inside TLS with
// Config.MasterTLS, unless Config.MasterGRPC is set), bytes go through the
// Transfer Engine straight between the client's memory and the replicas in
// other clients' segments (a plain copy when the replica is in this
// process, shared memory on this host, TCP elsewhere).
//
//	c, _ := client.New(ctx, client.Config{Master: "10.0.0.1:50051", SegmentSize: 4 << 30})
//	defer c.Close()                                   // unmounts; its replicas leave the pool
//	_ = c.Put(ctx, "blk-42", kv, &client.ReplicateConfig{Replicas: 2})
//	v, err := c.Get(ctx, "blk-42")                    // ErrObjectNotFound when absent
//
// Under HA, Master is "etcd://h1:2379;h2:2379": the client looks the leader
// up in etcd and follows it through failovers, retrying calls that found no
// master serving within RPCTimeout. Every master call is safe to repeat.
//
// # Data path
//
// Put asks the master for one replica per segment (PutStart), writes each
// (values in memory registered with RegisterBuffer go as they are, others
// through the staging buffer, in waves when a batch is larger than it),
// then ends the put with the value's CRC-32C (PutEnd), or revokes it when a
// write failed. Puts are write-once as in Mooncake: a put of an existing
// key succeeds without overwriting; Upsert replaces. A put session is the
// same put taken apart, for values that become available piece by piece
// (a KV cache layer by layer): StartPutSession is the PutStart,
// BatchPutRanges writes pieces into the reserved replicas with no master
// round trip, EndPutSession is the PutEnd (RevokePutSession the revoke).
// Values of at most 64 KiB that a client puts again and again (and every
// value with Config.ReservePuts) go into put slots instead: space reserved
// on the master while the puts before them were written, written and then
// committed with one master call (BatchPutCommit) in place of PutStart and
// PutEnd (put_slots.go). The slots of a reserve whose answer was lost are
// asked for again under the reserve's nonce once the master answers, and
// given back, as at Close.
//
// Get looks the replicas up (BatchGetReplicaList, which grants a lease),
// reads from the nearest complete one — DRAM before SSD; this process,
// this host, then others — verifies the checksum, and falls back to the
// next replica when a read or the checksum fails. The checksum is taken by
// the engine slice by slice as the bytes land (engine.WithChecksum), on the
// goroutines that moved them while later slices are still in flight, and
// the slices' checksums are combined (internal/crc32c): a verified read
// makes no second pass over the value. A put of a value of 128 KiB or more
// to another process is summed the same way, by the writes that carry it;
// smaller values are summed by the caller, so that a batch of them stays
// free to cross the engine as one request. A read that outlives its
// lease fails with LEASE_EXPIRED, since the space may hold another object
// by then. Looked-up replica lists are cached until the last quarter of
// their lease, so repeated reads skip the master; the master frees no
// replica while a lease runs, so a cached read sees the value as of the
// lookup (or, after another client's upsert, the one before it, as any
// lease holder would). A cached read that fails looks up afresh.
//
// A replica may be striped (ReplicateConfig.Stripes, or the master's
// policy for large values): cut into pieces on distinct segments, its
// value their concatenation (stripes.go). Every read and write of it is
// cut at the pieces, each piece one engine request and all of them one
// batch, so a get draws on the links of several hosts at once; a piece in
// this process is a plain copy, and the checksum folds each piece's sum
// in at its place in the value. A striped replica counts as in this
// process (or host) only when all its pieces are.
//
// Caller memory may be GPU memory (a CUDA tensor's data, registered with
// RegisterBuffer or not): the client finds it by asking the engine, or the
// CUDA driver the process has loaded, and never touches it with the CPU.
// It moves through the engine (which copies device memory with the driver,
// a replica in this process included) or through the staging buffer by the
// driver's copies, and the checksum of a value put from it is the one the
// transfers took from the host bytes they moved (see gpu.go).
//
// The client pings the master every second; a master that does not know it
// (restarted, failed over, or expired it) gets its segments remounted.
// Ping answers also carry SSD-tier moves for this client to copy.
//
// Errors are *storepb.Error with Mooncake's codes; test them with errors.Is
// against storepb's sentinels (ErrObjectNotFound, ErrNoAvailableHandle,
// ErrChecksumMismatch, ...).
package client
