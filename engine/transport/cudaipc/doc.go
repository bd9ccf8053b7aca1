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
// (the host identity of package shm) and publishes IPC buffers. Every slice
// it cannot serve goes to the next path unchanged: one whose remote range
// lies in the peer's host memory, one on an allocation whose handle this
// process cannot open (no such GPU here, the driver refused: logged once,
// the allocation is then left to the next path for good), and every slice
// when this process has not loaded the CUDA driver (the path never loads
// it: a process that does not use CUDA keeps it out, see package device).
//
// The peer's view goes stale when it re-registers GPU memory. A slice on a
// range the view does not know at all, or whose copy fails, refreshes the
// view once from the peer's current descriptor (mappings of allocations
// the peer no longer publishes are closed) and is tried again; if it fails
// again on the same allocation it fails with ErrCopy, not retried.
//
// Checksums: the CPU never reads device memory. When the engine asks for
// the CRC of a slice on GPU memory, the copy goes through a host bounce
// buffer whose bytes are summed; otherwise it is one device copy.
package cudaipc
