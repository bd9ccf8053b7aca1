// Package faults holds the network-fault scenarios of mooncake-go: the
// Transfer Engine and the store run on hosts emulated by internal/netlab
// while links between them are cut, made lossy, slow or narrow, and each
// test states what must hold (correct bytes, final statuses within their
// deadlines, no acknowledged write lost) and measures what happened.
//
// The tests are the package (there is no library code). Each scenario
// records a row of the fault table; with MC_FAULT_TABLE set to a path the
// run writes the table there as Markdown (make faults-table regenerates
// docs/faults.md).
package faults
