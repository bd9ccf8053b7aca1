// Package cudaipc moves slices between this process and the GPU memory of
// another process on the same host through CUDA IPC: the peer publishes,
// with its segment descriptor, the IPC handle of each device allocation
// that holds a registered buffer; this process maps an allocation once, on
// the first slice that needs it, and copies with one driver call
// (cuMemcpy, unified addressing), whether the local side is GPU or host
// memory. No byte crosses a socket and the peer's CPU does nothing.
//
// The path is first among the engine's built-in paths (before staging).
// It opens a peer only when the peer runs in another process of this host
// (the host identity of package shm), publishes IPC buffers and the
// control counter of its same-host path (package shm), which moves
// whenever it unregisters memory. Every slice
// it cannot serve goes to the next path unchanged: one whose remote range
// lies in the peer's host memory, one on an allocation whose handle this
// process cannot open (no such GPU here, the driver refused: logged once,
// the allocation is then left to the next path for good), and every slice
// when this process has not loaded the CUDA driver (the path never loads
// it: a process that does not use CUDA keeps it out, see package device).
//
// The peer's view goes stale when it re-registers GPU memory, and a
// mapping may outlive the peer's free (the driver makes no promise about
// it): a copy through it could succeed into memory nobody reads. So
// each copy first checks the control counter against the value the view
// was published with. A moved counter, a range the view does not know at
// all, or a failed copy refreshes the view once from the peer's current
// descriptor (mappings of allocations the peer no longer publishes are
// closed) and the slice is tried again; a range the fresh view does not
// map passes on (the peer refuses it if it is gone), and a copy that fails
// again on the same allocation fails with ErrCopy, not retried. A copy
// racing the peer's unregistration is not caught (as on the same-host
// path): the counter is read before the copy, not held.
//
// Checksums: the CPU never reads device memory. When the engine asks for
// the CRC of a slice on GPU memory, the copy goes through a host bounce
// buffer whose bytes are summed; otherwise it is one device copy.
package cudaipc
