// Command capi is the Go half of libmooncake.so, the C ABI of the Transfer
// Engine and the Mooncake Store client. Build the library with
//
//	bash scripts/build-capi.sh build
//
// which writes two files that are one library, to be installed side by side,
// and links libtransfer_engine.so (the name Mooncake's consumers load) to
// the first:
//
//   - libmooncake.so, the public library: a small C library (shim.c and the
//     other C files that call the Go exports, loader.c, and one forwarder
//     per Go export that capi/internal/shimgen generates from the header cgo
//     writes) whose dynamic symbols are exactly the functions of the two
//     headers below;
//   - libmooncake_go.so, this package built with -buildmode=c-shared, which
//     exports the mcgo* functions and nothing else.
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
// This package is the only place with //export. A new export needs no step
// by hand: its forwarder is generated. The build fails when libmooncake.so
// does not define exactly the functions include/*.h declare, or when an
// export's failure value (below) cannot be told from its C type.
//
// # Loading, and fork
//
// A Go runtime starts its threads when its library is loaded, and fork()
// copies only the thread that forks: in the child the runtime is dead and a
// call into it hangs. Hosts fork: vLLM's workers (fork is its default start
// method on CPU), Python programs with multiprocessing, C servers that
// preload and fork. So libmooncake.so has no runtime of its own; the first
// call that needs Go loads libmooncake_go.so from the directory of
// libmooncake.so (or of the file it links to), once per process
// (pthread_once), and resolves the exports. From then on a forwarder is one
// load, a compare and a jump through the resolved pointer. What holds:
//
//   - a process may load the library (link it, dlopen it, import the Python
//     package) and call the functions that need no Go (mc_abi_version,
//     mc_status_name, the free functions), then fork: every process that
//     then calls starts its own runtime, parent and children alike;
//   - after a fork that follows a call that needed Go, the child cannot use
//     the library, and no call there hangs: every one fails at once, a
//     mooncake.h call with MC_ERR_PANIC and a message saying that the
//     process was forked after the runtime started, a Mooncake API call with
//     its failure value (-1, NULL, INVALID_BATCH; nothing for void ones)
//     and, the first time, that message on stderr. Handles from the parent
//     are of no use there. The child is seen by a pthread_atfork handler,
//     and, where two copies of libmooncake.so share one libmooncake_go.so,
//     by the pid the Go library recorded when it was loaded (loaded_pid.c);
//     a child made by a raw fork system call, which runs no atfork
//     handlers, is not seen;
//   - one process has one Go runtime: both names of the library are one
//     file, and a copy of libmooncake.so elsewhere (a Python wheel's beside
//     a NIXL plugin's build/) uses the Go library of its build that the
//     process has loaded already, recognised by its GNU build ID (two
//     builds of one tree link alike, so the wheel and build/ match). Never
//     dlclose either file;
//   - a Go library of another build is never called: the loader compares
//     the build ID of the one it loads with the one it was built against,
//     and fails every call if they differ (the exports' C signatures are
//     one build's).
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
// API) and the host process carries on. A panic in a call on a handle also
// poisons the handle (lifetime.run): its object may be half-updated, so
// every later call on it is refused with MC_ERR_PANIC, and only its
// destroy still runs.
//
// # Handles end their calls
//
// Each engine and store carries a context (lifetime) that its blocking
// calls derive theirs from: opening a segment, sending a notification and
// mc_engine_wait on an engine, every call on a store (bounded further by
// the store's op_timeout_ms). Destroying the handle cancels that context
// before it closes the object, so a thread blocked on a silent peer
// returns at once with MC_ERR_CANCELED instead of holding the destroy up
// for as long as its deadline.
//
// # How the ABI grows
//
// The rules are mooncake.h's VERSIONING; what they mean for this package:
//
//   - a minor version adds functions, appends status codes, or appends
//     fields to the structs that carry a struct_size; nothing is moved,
//     resized or removed, and a new field's zero value is its default
//     (what callers of older headers leave there);
//   - structs the caller passes in are read through readStruct: a
//     struct_size below the struct's MC_*_SIZE_V1 is MC_ERR_STRUCT_SIZE;
//     only struct_size bytes are read, so the fields an older caller does
//     not have are zero; bytes past this library's struct must be zero
//     (a newer caller's fields left at their defaults), else the call is
//     refused, never silently ignored;
//   - appending a field: add it at the end of the struct in the header
//     with the ABI version that made it, define MC_<STRUCT>_SIZE_V<n+1>
//     as the offset past it, bump MC_ABI_VERSION_MINOR, add the field to
//     the ctypes struct in python/src/mooncake_go/_lib.py
//     (python/tests/test_abi_layout.py compares the two), and give the
//     C suite (capi/tests/test_abi.c) a caller of the previous size;
//   - output structs of this major version have no struct_size and do not
//     grow; one that must grow gets a struct_size set by the caller, and
//     the library writes only that many bytes of it.
package main

func main() {}
