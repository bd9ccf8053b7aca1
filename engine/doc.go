// Package engine is the Transfer Engine: it moves bytes between registered
// memory of this process and the memory of peer processes, on this host or
// others, in batches, without copying payloads through Go buffers.
//
// # Lifecycle
//
// New starts an engine: a handshake socket (Mooncake's framing: metadata
// exchange, notifications, probes) and a TCP data socket (Mooncake's TE v2
// wire format). Memory is registered with RegisterMemory (any address: C,
// mmap, Python) or allocated with AllocateBuffer (memfd-backed, so a peer on
// the same host can map it). A peer is opened by segment name with
// OpenSegment; transfers are submitted in batches:
//
//	b, _ := e.AllocateBatch(n)
//	e.Submit(ctx, b, reqs)     // returns once queued
//	st, _ := e.Wait(ctx, b)    // or poll TaskStatus/BatchStatus
//	e.FreeBatch(b)             // CodeBatchBusy while tasks run
//
// Calls that may block take a context first (New, RegisterMemory,
// OpenSegment, Submit, Wait, SendNotify); it bounds the call, never the
// life of what the call started: a transfer queued by Submit goes on after
// its ctx ends, bounded by its own deadline.
//
// Close removes the engine's metadata records, fails whatever is in flight
// and waits for every goroutine it started.
//
// # Names and metadata
//
// With Config.Metadata "P2PHANDSHAKE" (the default) there is no metadata
// server: the engine's name is "host:rpcport" and OpenSegment asks the peer
// for its descriptor over the handshake socket. With "etcd://", "http://" or
// "memory://" the engine publishes mooncake/ram/<name> and
// mooncake/rpc_meta/<name> exactly as Mooncake does, so official engines and
// ours find each other in one store.
//
// # Data paths
//
// The engine moves bytes only through package transport's interfaces. Its
// paths are kept in order of preference: Config.Transports, then the
// same-host path (unless Config.Transport is "tcp"), then TCP (unless it is
// "shm"). Opening a segment offers the peer to every path, the last first,
// each getting the peer opened on the path after it as PeerInfo.Next; a
// path that does not reach the peer declines (transport.ErrUnavailable).
// Slices go to the first path that opened, which passes on what it cannot
// serve: the same-host path hands a peer it can no longer map to TCP.
// Optional capabilities are found by type assertion: transport.Inliner for
// inline sends (below), transport.Publisher for a path that adds its part to
// this engine's descriptor. Neither engine.go nor batch.go names a
// transport; a new path (GPU staging, CUDA IPC, RDMA) is a new package
// implementing transport.Transport, and transporttest's fake lets tests
// settle slices in orders no socket produces.
//
// A Request carries the absolute remote virtual address, as Mooncake. Remote
// requests are cut into slices of Config.SliceSize (the tail absorbs a
// remainder under a quarter slice). To a peer on this host (same boot id
// and pid namespace) slices are copied through shared memory: memfd buffers
// are mapped once and copied with memmove, other registered memory with
// process_vm_readv/writev. Otherwise, or when Config.Transport is "tcp",
// slices spread over Config.Lanes persistent TCP connections per peer, each
// a valid Mooncake v2 request; payload is written from and read into
// registered memory directly (writev/readv, no intermediate buffer). A peer
// may publish several data addresses (a host with several NICs): lanes
// spread over them, and one that refused a dial is passed over for a
// while. A small Submit to an idle peer is sent by the calling goroutine on
// one connection, and Wait reads its answers itself: no goroutine
// hand-offs.
//
// A peer's memory changes while it is open: frameworks register more as
// they grow, free buffers and allocate new ones. The same-host path works
// from a view of the peer's descriptor, which it checks before each copy
// against the peer's control counter (moved by every unregistration). A
// slice outside the view, or met with a moved counter, is not failed: the
// path asks the peer for its current descriptor over the handshake socket
// (PeerInfo.Describe), swaps the view (mapping new memfd buffers, unmapping freed ones
// once no copy uses them) and tries again; only a range the fresh view
// still lacks fails, as the peer itself would refuse it. Refreshes of one
// segment are coalesced and spaced (one in flight, one per 20 ms), run off
// the copy workers, and never hold up transfers to other peers.
//
// WithChecksum has the engine take the CRC-32C of every request's bytes:
// each slice is summed as it lands, on the goroutine that moved it, and the
// sums are combined per task (TransferStatus.Checksum), so verifying a read
// costs no pass over the bytes after the transfer.
//
// GPU memory of another process on this host moves without a socket, through
// CUDA IPC (transport/cudaipc, first of the built-in paths unless
// Config.Transport is "tcp"): an engine publishes, with its descriptor, the
// IPC handle of the device allocation under each registered GPU buffer
// (mcgo_cuda_ipc, with its host identity and pid); a peer in another process
// of the same host maps an allocation once, on the first slice that needs it,
// and copies each slice with one driver call, from its own GPU or host
// memory (host-to-device and device-to-host included); a worker takes the
// adjacent slices queued behind its own with the same call (up to 64 MiB),
// since a driver copy costs microseconds whatever its length. A range in the peer's
// host memory, an allocation whose handle cannot be opened here (logged once)
// or a process that has not loaded the driver go on to staging and the paths
// after it. Each copy first checks the peer's control counter (above), so
// memory the peer unregistered is not written through a stale mapping; a
// moved counter, a range the view lacks or a failed copy refreshes the view
// once (PeerInfo.Describe) before the slice passes on or fails.
//
// # GPU memory
//
// Memory registered at "cuda:N" must be memory of GPU N, as the CUDA
// driver says (package device loads it at run time: libcuda.so.1, or
// MC_CUDA_DRIVER; nothing at build time needs CUDA). Memory registered as
// "*", "cpu:N" or "" is looked up too, when the process has loaded the
// driver already (a pointer can be device memory only then; the engine
// never loads CUDA into a process that does not use it). Without a driver,
// "cuda:N" fails with CodeDeviceNotFound and says why. Descriptors mark
// device buffers (Buffer.Location, our extension).
//
// The CPU never reads or writes device memory: the driver copies it, and a
// copy returns only once its bytes have landed (the driver's legacy stream
// is synchronised after each: a device-to-device copy, or one from
// pageable memory, returns before). Requests from GPU memory are cut into
// slices of Config.DeviceSliceSize (1 MiB) rather than SliceSize. Slices
// whose local bytes are on a GPU are staged through page-locked host
// buffers by the staging path (transport/stage) onto whichever path moves
// the bytes, copy and network overlapping across the slices of a request;
// a peer serving its GPU memory over TCP copies it through host chunks; the
// same-host path leaves GPU ranges to the next path; checksums are taken
// from the host copies. The wire format does not change.
//
// # Several NICs
//
// A host with several links lists their addresses in Config.ExtraHosts (or
// MC_TCP_BIND_ADDRESSES=ip1,ip2: the first is Host). The TCP data port
// listens on each; the descriptor keeps Mooncake's fields as they were
// (tcp_data_port, reached at the rpc_meta host, which is all an official
// engine reads) and adds the others as mcgo_tcp_data_addrs. An initiator
// spreads its lanes over every address a peer publishes, and over its own
// addresses when it has several (lane i dials from local i to peer
// address i when both have as many), so one transfer uses every link.
// With more than one path to a peer, a path that goes silent (data
// unacknowledged, keepalives unanswered) for about 2 s is given up: its
// connections are cut, their slices sent again on another path (a retry
// each), and new lanes pass its address over for a while. When every path
// is down, the slices fail as with one path, Failed once retries run out
// or Timeout at the deadline.
//
// # Failure semantics
//
//   - Every request has a deadline (Config.Timeout, or WithDeadline); a task
//     whose deadline passes is Timeout, never left Pending.
//   - A slice that failed on a broken connection, or on a path found down
//     (see Several NICs), is retried on another lane (and address), at most
//     Config.MaxRetries times, then Failed.
//   - The serving side checks every range against its registered,
//     remote-accessible regions before touching memory, and pins the region
//     so UnregisterMemory waits for requests in progress.
//   - A Write is Completed only once the target acknowledged the bytes in its
//     memory (v2 status frame after the payload).
//   - With Config.Secret set, every handshake and data connection starts with
//     a mutual HMAC challenge; a peer without the secret can do nothing.
//
// Errors carry a Code numbered as Mooncake's error.h; task and batch status
// values are numbered as Mooncake's TransferStatusEnum.
package engine
