// Command capi is libmooncake.so, the C ABI of the Transfer Engine and the
// Mooncake Store client. Build it with
//
//	go build -buildmode=c-shared -o build/libmooncake.so ./capi
//
// (scripts/build-capi.sh does, deletes cgo's generated header and links
// libtransfer_engine.so to it, the name Mooncake's consumers load).
//
// Two C APIs come out of it:
//
//   - include/mooncake.h, the native one: versioned, opaque 64-bit handles,
//     a status code from every call and a caller-owned mc_error_t with the
//     message;
//   - include/transfer_engine_c.h, Mooncake's own C API (createTransferEngine,
//     openSegment, submitTransfer, getNotifsFromEngine, ...), so that NIXL's
//     Mooncake plugin and TensorRT-LLM's Mooncake agent run on this library
//     unchanged.
//
// # How the boundary is kept
//
// shim.c defines every public C function and calls a Go export (mcgo*) with
// plain C types: the public names keep their const qualifiers and void*
// handles, and the C compiler checks both headers against the Go exports.
// This package is the only place with //export.
//
// Go values never leave Go. An engine or store is an entry of the live
// table (handles.go) under the number cgo.NewHandle gave it; C holds the
// number. Looking a number up that was released, never issued, or names
// the other kind of object is an error (MC_ERR_INVALID_HANDLE), not a
// crash. Payloads are C memory (or memory the engine mapped), seen from Go
// through unsafe.Slice without copying; strings handed to C are C.malloc'd
// and freed by the paired free function, or written into caller buffers.
//
// Every export runs its body under a recover (guard in mooncake.h, teCall
// in the Mooncake API): a panic becomes MC_ERR_PANIC (-1 in the Mooncake
// API) and the host process carries on.
package main

func main() {}
