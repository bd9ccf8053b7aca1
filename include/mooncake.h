/*
 * mooncake.h - the C ABI of libmooncake.so (mooncake-go).
 *
 * This header is the contract; it is written by hand and versioned. The
 * library is built from Go (capi/, -buildmode=c-shared); nothing of Go shows
 * through it: no Go types, no Go pointers, no Go strings.
 *
 * Two objects live behind it:
 *
 *   - the Transfer Engine (mc_engine_*): registers memory of this process,
 *     opens peers' segments by name and moves bytes between the two in
 *     batches of requests, with notifications between engines;
 *   - the Mooncake Store client (mc_store_*): contributes memory to a store
 *     pool and puts/gets objects by key.
 *
 * CONVENTIONS
 *
 * Handles. Engines and stores are opaque 64-bit handles (mc_engine_t,
 * mc_store_t). 0 is never a valid handle. A handle stays valid until it is
 * destroyed/closed; afterwards every call with it returns
 * MC_ERR_INVALID_HANDLE (never a crash), and so does a handle of the wrong
 * kind (a store handle passed as an engine) or a made-up value. Segments
 * (mc_segment_t) and batches (mc_batch_t) are small integers that are only
 * meaningful to the engine that issued them.
 *
 * Status and errors. Every function returns an mc_status_t: MC_OK (0) or a
 * negative code. Engine functions return the Transfer Engine's codes
 * (numbered as Mooncake's error.h), store functions the Store's codes
 * (numbered as Mooncake's ErrorCode); both tables are below, and both share
 * the MC_ERR_* codes of the ABI itself (-9000 and below). Which table a code
 * belongs to is fixed by the function that returned it and is also written
 * to mc_error_t.domain. Every function takes a last argument
 * `mc_error_t *err` that may be NULL; when it is not NULL and the call
 * fails, the library writes the code, the domain and a NUL-terminated
 * message there (on success it sets code to MC_OK, domain to
 * MC_DOMAIN_NONE and message to ""). The caller owns the struct (stack
 * memory is fine); the library keeps no pointer to it. One struct per call
 * and thread makes errors thread-safe.
 *
 * Memory. The library never keeps a pointer to caller memory after a call
 * returns, except for memory registered with mc_engine_register_memory /
 * mc_store_register_buffer (until it is unregistered) and payload buffers
 * of submitted transfers (until their task is final). All strings passed in
 * are read during the call only. Memory the library allocates for the
 * caller (mc_engine_get_notifies) is freed with the paired function
 * (mc_notifies_free), never with anything else. Strings the library writes
 * go into caller buffers with the "len_out" protocol: the call writes as
 * much as fits (always NUL-terminated when buf_len > 0) and stores the full
 * length, NUL included, in *len_out; if it did not fit it returns
 * MC_ERR_BUFFER_TOO_SMALL.
 *
 * Threads. Every function may be called from any thread, concurrently,
 * on the same handle. Blocking calls (open segment, send notify, wait,
 * every store call) block only the calling thread, each up to its own
 * limit: the engine's timeout_ms for opening a segment and sending a
 * notification, the timeout_ms argument of mc_engine_wait, the store's
 * rpc_timeout_ms per master call and op_timeout_ms per call (ABI 1.5).
 * Destroying a handle (mc_engine_destroy, mc_store_close) while other
 * threads use it is safe, and cancels what they are blocked in rather
 * than waiting for it: a call in progress on the handle returns
 * MC_ERR_CANCELED promptly, one that starts afterwards
 * MC_ERR_INVALID_HANDLE.
 *
 * Panics. Every entry point recovers from an internal Go panic and returns
 * MC_ERR_PANIC with the panic's message; the host process keeps running.
 * A panic in a call on a handle poisons the handle: the object behind it
 * may be left half-updated, so every later call on it fails at once with
 * MC_ERR_PANIC and a message that says so (naming the first panic), except
 * its destroy/close, which still releases it. Other handles are not
 * affected. In the Mooncake API (transfer_engine_c.h) a poisoned engine's
 * calls return their failure value.
 *
 * Process. One libmooncake.so per process (a Go runtime cannot be loaded
 * twice, and it cannot be unloaded: never dlclose it). libtransfer_engine.so
 * is the same library under Mooncake's name (a symbolic link, so loading
 * both names still loads one file; never install it as a separate copy
 * beside libmooncake.so); transfer_engine_c.h is its Mooncake-compatible
 * API, and handles of the two APIs live in one table. libmooncake.so comes
 * with libmooncake_go.so, installed beside it: the Go runtime, which
 * libmooncake.so loads at the first call that needs it (every call but
 * mc_abi_version, mc_status_name and the free functions), not when it is
 * loaded itself. The library then installs Go's signal handlers; handlers
 * the host installs later must use SA_ONSTACK. It logs to stderr at
 * MC_LOG_LEVEL (debug, info, warn, error; default warn).
 *
 * Fork. A process may load the library and fork before that first call:
 * each process that then calls starts a runtime of its own, parent and
 * children alike. A runtime does not survive fork(), so in the child of a
 * fork that follows the first call the library cannot work: every call
 * that needs the runtime fails at once (it does not hang) with
 * MC_ERR_PANIC and a message that says the process was forked; handles of
 * the parent mean nothing there. The Mooncake API's calls return their
 * failure value (-1, NULL, INVALID_BATCH) and the first one says why on
 * stderr. Fork before the first call, or start children with exec.
 *
 * VERSIONING
 *
 * MC_ABI_VERSION is (major << 16) | minor. A minor bump only adds functions,
 * appends codes to the status enum, or appends fields to structs that
 * carry a struct_size; a major bump breaks compatibility. A program
 * compiled against this header should check at start that
 * (mc_abi_version() >> 16) == MC_ABI_VERSION_MAJOR and
 * (mc_abi_version() & 0xffff) >= MC_ABI_VERSION_MINOR.
 *
 * How structs grow. The structs a caller passes in (mc_engine_config_t,
 * mc_store_config_t, mc_replicate_config_t) start with uint32_t
 * struct_size, which the caller sets to sizeof(the struct) of the header
 * it was compiled against; the *_init helpers do, after zeroing it. Every
 * version of such a struct is a prefix of the next: fields are only ever
 * appended, never moved, resized or removed, and each one's zero value
 * means its default, so that a field a caller does not know of is zero.
 * For each struct, MC_<STRUCT>_SIZE_V<n> is its size as of its version n
 * (the version of the ABI that made it is written beside it). The library
 * of any later minor version:
 *
 *   - refuses a struct_size below MC_<STRUCT>_SIZE_V1, or above 65536,
 *     with MC_ERR_STRUCT_SIZE (struct_size was not set), and one below its
 *     own sizeof that is no MC_<STRUCT>_SIZE_V<n> (it would cut a field);
 *   - reads the first struct_size bytes and no more, so a caller built
 *     against an older header keeps working: the fields appended since
 *     take their defaults;
 *   - accepts a struct_size larger than its own sizeof (a caller built
 *     against a newer header) only when every byte past its own struct is
 *     zero, that is when the caller left the fields this library does not
 *     know at their defaults; a nonzero byte there is MC_ERR_STRUCT_SIZE,
 *     with the offset in the message, rather than a setting silently
 *     ignored. Callers that may run on an older library therefore set new
 *     fields only after checking mc_abi_version().
 *
 * A struct the library fills in for the caller that grows the same way
 * will carry a struct_size set by the caller too, and the library will
 * write only the first struct_size bytes of it. The output structs of
 * this version (mc_transfer_status_t, mc_buffer_desc_t, mc_notify_t,
 * mc_replica_desc_t, mc_error_t) have none: they are fixed for major
 * version 1, and what they would need is added as new functions.
 */
#ifndef MOONCAKE_H
#define MOONCAKE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1.0: the first release. 1.1: values made of parts
 * (mc_store_batch_put_from_parts, mc_store_batch_get_into_parts).
 * 1.2: mc_store_remove_by_regex, mc_store_batch_remove.
 * 1.3: ranged reads (mc_store_batch_get_ranges), get sessions
 * (mc_store_batch_get_session_start/_end), replica descriptors
 * (mc_store_get_replicas).
 * 1.4: put sessions (mc_store_batch_put_session_start/_end/_revoke) and
 * ranged writes into them (mc_store_batch_put_ranges).
 * 1.5: mc_store_config_t.op_timeout_ms (MC_STORE_CONFIG_SIZE_V2);
 * destroying a handle cancels the calls in progress on it
 * (MC_ERR_CANCELED); a panic poisons its handle; structs of a newer
 * header are accepted when their unknown fields are zero (VERSIONING).
 * 1.6: mc_copy.
 * 1.7: mc_store_config_t.report_existing (MC_STORE_CONFIG_SIZE_V3).
 * 1.8: mc_store_config_t.auth_token, tls_ca_file, tls_cert_file,
 * tls_key_file, te_secret (MC_STORE_CONFIG_SIZE_V4).
 * 1.9: dummy clients (mc_dummy_*).
 * 1.10: mc_store_config_t.tenant_id (MC_STORE_CONFIG_SIZE_V5);
 * MC_STORE_ERR_TENANT_QUOTA_EXCEEDED.
 * 1.11: mc_replicate_config_t.stripe_count (MC_REPLICATE_CONFIG_SIZE_V2).
 * 1.12: mc_store_config_t.tls_server_name (MC_STORE_CONFIG_SIZE_V6). */
#define MC_ABI_VERSION_MAJOR 1
#define MC_ABI_VERSION_MINOR 12
#define MC_ABI_VERSION ((MC_ABI_VERSION_MAJOR << 16) | MC_ABI_VERSION_MINOR)

/* mc_abi_version returns the MC_ABI_VERSION the library was built with. */
uint32_t mc_abi_version(void);

/* ------------------------------------------------------------------------
 * Status codes and errors
 * ------------------------------------------------------------------------ */

typedef int32_t mc_status_t;

/* Domains: which table a code belongs to. */
enum {
    MC_DOMAIN_NONE = 0,   /* MC_OK */
    MC_DOMAIN_ABI = 1,    /* MC_ERR_*: the C ABI itself */
    MC_DOMAIN_ENGINE = 2, /* MC_TE_ERR_*: Transfer Engine (error.h) */
    MC_DOMAIN_STORE = 3   /* MC_STORE_ERR_*: Store (ErrorCode) */
};

enum {
    MC_OK = 0,

    /* The ABI's own codes, returned by engine and store functions alike. */
    MC_ERR_INVALID_HANDLE = -9001,   /* 0, destroyed, foreign or unknown handle */
    MC_ERR_NULL_ARGUMENT = -9002,    /* a required pointer argument is NULL */
    MC_ERR_PANIC = -9003,            /* internal panic, recovered; the handle is poisoned (see Panics); or forked after use (see Fork) */
    MC_ERR_BUFFER_TOO_SMALL = -9004, /* output did not fit; see *len_out */
    MC_ERR_TIMED_OUT = -9005,        /* mc_engine_wait's timeout_ms, or a store's op_timeout_ms, ran out */
    MC_ERR_STRUCT_SIZE = -9006,      /* struct_size out of range, or unknown fields set (see VERSIONING) */
    MC_ERR_TRANSFER_FAILED = -9007,  /* a task failed without a finer code */
    MC_ERR_CANCELED = -9008,         /* the handle was destroyed while the call was in progress (1.5) */

    /* Transfer Engine codes (engine.Code), numbered as Mooncake's error.h. */
    MC_TE_ERR_INVALID_ARGUMENT = -1,
    MC_TE_ERR_TOO_MANY_REQUESTS = -2,
    MC_TE_ERR_ADDRESS_NOT_REGISTERED = -3,
    MC_TE_ERR_BATCH_BUSY = -4,
    MC_TE_ERR_DEVICE_NOT_FOUND = -6,
    MC_TE_ERR_ADDRESS_OVERLAPPED = -7,
    MC_TE_ERR_DNS = -101,
    MC_TE_ERR_SOCKET = -102,
    MC_TE_ERR_MALFORMED_JSON = -103,
    MC_TE_ERR_REJECT_HANDSHAKE = -104,
    MC_TE_ERR_METADATA = -200,
    MC_TE_ERR_ENDPOINT = -201,
    MC_TE_ERR_CONTEXT = -202, /* also: the engine is closed */
    MC_TE_ERR_NUMA = -300,
    MC_TE_ERR_CLOCK = -301,
    MC_TE_ERR_MEMORY = -302,
    MC_TE_ERR_NOT_IMPLEMENTED = -303,

    /* Store codes (storepb.Code), numbered as Mooncake's ErrorCode. */
    MC_STORE_ERR_INTERNAL = -1,
    MC_STORE_ERR_SEGMENT_NOT_FOUND = -101,
    MC_STORE_ERR_NO_AVAILABLE_HANDLE = -200, /* the pool is full */
    MC_STORE_ERR_INVALID_PARAMS = -600,
    MC_STORE_ERR_OBJECT_NOT_FOUND = -704,
    MC_STORE_ERR_OBJECT_ALREADY_EXISTS = -705,
    MC_STORE_ERR_OBJECT_HAS_LEASE = -706,
    MC_STORE_ERR_LEASE_EXPIRED = -707,
    MC_STORE_ERR_TRANSFER_FAIL = -800,
    MC_STORE_ERR_CHECKSUM_MISMATCH = -801,
    MC_STORE_ERR_RPC_FAIL = -900,
    MC_STORE_ERR_RPC_TIMEOUT = -901,
    MC_STORE_ERR_ETCD_OPERATION_ERROR = -1000,
    MC_STORE_ERR_TENANT_QUOTA_EXCEEDED = -1700 /* ABI 1.10: the put would take its tenant over its quota */
};

#define MC_ERROR_MESSAGE_SIZE 512

/* mc_error_t is owned by the caller; see CONVENTIONS. */
typedef struct mc_error {
    int32_t code;   /* the returned status */
    int32_t domain; /* MC_DOMAIN_* */
    char message[MC_ERROR_MESSAGE_SIZE]; /* NUL-terminated, may be truncated */
} mc_error_t;

/* mc_status_name returns a static, NUL-terminated name for a code of a
 * domain ("OK", "INVALID_HANDLE", "BATCH_BUSY", "OBJECT_NOT_FOUND", ...), or
 * "UNKNOWN". The pointer is valid for the life of the process; do not free. */
const char *mc_status_name(int32_t domain, mc_status_t code);

/* ------------------------------------------------------------------------
 * Transfer Engine
 * ------------------------------------------------------------------------ */

typedef uint64_t mc_engine_t;  /* opaque handle, 0 = none */
typedef uint64_t mc_segment_t; /* per-engine segment id; MC_LOCAL_SEGMENT = own */
typedef uint64_t mc_batch_t;   /* per-engine batch id, never 0 */

#define MC_LOCAL_SEGMENT ((mc_segment_t)0)

/* Engine configuration. Zero (NULL) fields mean the default given. */
typedef struct mc_engine_config {
    uint32_t struct_size; /* sizeof(mc_engine_config_t); see VERSIONING */
    uint32_t lanes;       /* TCP connections per peer; 0: 4 (MC_TCP_LANES_PER_PEER) */
    /* "P2PHANDSHAKE" (NULL), "etcd://h:p", "http://h:p/metadata", "memory://name" */
    const char *metadata;
    /* this engine's segment name; in P2PHANDSHAKE mode it becomes
     * "<host>:<rpc port>". NULL: the same. */
    const char *local_server_name;
    /* address peers reach this engine at and its sockets bind; NULL:
     * MC_TCP_BIND_ADDRESS, else the host of local_server_name if an IP, else
     * the first non-loopback IPv4, else 127.0.0.1 */
    const char *host;
    /* "auto" (NULL: shared memory on this host, TCP elsewhere), "tcp", "shm" */
    const char *transport;
    /* shared secret every peer must know; NULL: MC_TE_SECRET, else none */
    const char *secret;
    uint32_t rpc_port;    /* handshake port; 0: a free port */
    uint32_t data_port;   /* TCP data port; 0: a free port */
    uint64_t slice_size;  /* largest piece a request is cut into; 0: 128 KiB (else at least 4096) */
    /* deadline of each request from its submission (0: MC_TRANSFER_TIMEOUT
     * s, else 30 s); also bounds opening a segment and sending a
     * notification (0: 30 s) */
    uint64_t timeout_ms;
    uint32_t max_retries; /* retries of a slice on another lane; 0: 3 */
    uint32_t reserved;    /* must be 0 */
} mc_engine_config_t;

/* Sizes of the versions of mc_engine_config_t (see VERSIONING). */
#define MC_ENGINE_CONFIG_SIZE_V1 (offsetof(mc_engine_config_t, reserved) + sizeof(uint32_t)) /* ABI 1.0 */

/* mc_engine_config_init zeroes *cfg and sets struct_size. */
static inline void mc_engine_config_init(mc_engine_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = (uint32_t)sizeof *cfg;
}

/* Directions of a request, numbered as Mooncake's OPCODE_READ/WRITE. */
enum { MC_OP_READ = 0, MC_OP_WRITE = 1 };

/* One transfer: length bytes between local memory (registered with this
 * engine) and the absolute virtual address remote_addr in segment. READ
 * copies remote -> local, WRITE local -> remote. */
typedef struct mc_request {
    int32_t opcode;   /* MC_OP_READ or MC_OP_WRITE */
    uint32_t reserved; /* must be 0 */
    void *local;
    mc_segment_t segment;
    uint64_t remote_addr;
    uint64_t length;
} mc_request_t;

/* Task and batch states, numbered as Mooncake's STATUS_* values. */
enum {
    MC_TRANSFER_WAITING = 0,
    MC_TRANSFER_PENDING = 1,
    MC_TRANSFER_INVALID = 2,
    MC_TRANSFER_CANCELED = 3,
    MC_TRANSFER_COMPLETED = 4,
    MC_TRANSFER_TIMEOUT = 5,
    MC_TRANSFER_FAILED = 6
};

typedef struct mc_transfer_status {
    int32_t state;        /* MC_TRANSFER_* */
    int32_t error_code;   /* MC_TE_ERR_* (or MC_ERR_TRANSFER_FAILED) of a failure, else MC_OK */
    uint64_t transferred; /* bytes in place so far */
} mc_transfer_status_t;

/* A buffer a segment published (registered remote-accessible memory). */
typedef struct mc_buffer_desc {
    uint64_t addr;
    uint64_t length;
} mc_buffer_desc_t;

/* A notification received from a peer engine. name and msg are
 * NUL-terminated copies (name_len/msg_len exclude the NUL) owned by the
 * array returned by mc_engine_get_notifies. */
typedef struct mc_notify {
    char *name;
    char *msg;
    size_t name_len;
    size_t msg_len;
} mc_notify_t;

/* mc_engine_create starts an engine (its listeners and, outside
 * P2PHANDSHAKE, its metadata records) and stores its handle in *out.
 * cfg may be NULL for all defaults. */
mc_status_t mc_engine_create(const mc_engine_config_t *cfg, mc_engine_t *out, mc_error_t *err);

/* mc_engine_destroy closes the engine: calls blocked on it in other
 * threads (open segment, send notify, wait) return MC_ERR_CANCELED,
 * in-flight transfers fail, its sockets close, buffers from
 * mc_engine_allocate_buffer are unmapped, and the handle becomes invalid. Memory the caller registered is not freed
 * (it is the caller's). Destroying an invalid handle returns
 * MC_ERR_INVALID_HANDLE. */
mc_status_t mc_engine_destroy(mc_engine_t engine, mc_error_t *err);

/* mc_engine_name writes the engine's segment name (what peers open, e.g.
 * "10.0.0.7:15123") into buf; see the len_out protocol. len_out may be NULL. */
mc_status_t mc_engine_name(mc_engine_t engine, char *buf, size_t buf_len, size_t *len_out, mc_error_t *err);

/* mc_engine_ports stores the handshake (RPC) and TCP data ports; either
 * pointer may be NULL. */
mc_status_t mc_engine_ports(mc_engine_t engine, uint32_t *rpc_port, uint32_t *data_port, mc_error_t *err);

/* mc_engine_register_memory makes [addr, addr+length) usable in requests;
 * with remote_accessible != 0 peers may read and write it. location NULL
 * or "*" means "cpu:0", unless the process has the CUDA driver loaded and
 * it says addr is GPU memory; "cuda:N" must be memory of GPU N (the driver
 * is loaded at run time, libcuda.so.1 or MC_CUDA_DRIVER; without one,
 * MC_TE_ERR_DEVICE_NOT_FOUND). The library never touches GPU memory with
 * the CPU. The memory must stay valid until unregistered.
 * Overlapping an already registered range: MC_TE_ERR_ADDRESS_OVERLAPPED. */
mc_status_t mc_engine_register_memory(mc_engine_t engine, void *addr, uint64_t length,
                                      const char *location, int remote_accessible, mc_error_t *err);

/* mc_engine_unregister_memory removes the region registered at addr; it
 * returns once no transfer serving a peer touches it any more. */
mc_status_t mc_engine_unregister_memory(mc_engine_t engine, void *addr, mc_error_t *err);

/* mc_copy copies n bytes from src to dst, two addresses of this process,
 * each host or GPU memory: with the CUDA driver when either is GPU memory
 * (when the process has the driver loaded, it is asked), with the CPU
 * otherwise. A failed device copy is MC_TE_ERR_MEMORY. (1.6) */
mc_status_t mc_copy(void *dst, const void *src, uint64_t n, mc_error_t *err);

/* mc_engine_allocate_buffer maps size bytes of shared memory (memfd,
 * so a peer on the same host copies with one memcpy), registers it
 * remote-accessible and stores its address in *addr_out. Free it with
 * mc_engine_free_buffer (mc_engine_destroy frees those left). */
mc_status_t mc_engine_allocate_buffer(mc_engine_t engine, uint64_t size, const char *location,
                                      void **addr_out, mc_error_t *err);

/* mc_engine_free_buffer unregisters and unmaps a buffer from
 * mc_engine_allocate_buffer. */
mc_status_t mc_engine_free_buffer(mc_engine_t engine, void *addr, mc_error_t *err);

/* mc_engine_open_segment resolves a peer by segment name (in P2PHANDSHAKE
 * mode "host:rpcport") and stores its id in *out; opening a name twice
 * gives the same id, the engine's own name gives MC_LOCAL_SEGMENT. Blocks
 * up to the engine's timeout_ms (0: 30 s), or until the engine is
 * destroyed (MC_ERR_CANCELED). */
mc_status_t mc_engine_open_segment(mc_engine_t engine, const char *name, mc_segment_t *out, mc_error_t *err);

/* mc_engine_close_segment forgets an opened segment. */
mc_status_t mc_engine_close_segment(mc_engine_t engine, mc_segment_t segment, mc_error_t *err);

/* mc_engine_segment_buffers lists the buffers an opened segment published
 * (in registration order): up to cap entries go to out, *count_out gets
 * the total (MC_ERR_BUFFER_TOO_SMALL when it exceeds cap). out may be NULL
 * with cap 0 to ask for the count. */
mc_status_t mc_engine_segment_buffers(mc_engine_t engine, mc_segment_t segment, mc_buffer_desc_t *out,
                                      size_t cap, size_t *count_out, mc_error_t *err);

/* mc_engine_allocate_batch returns a batch that holds up to capacity tasks. */
mc_status_t mc_engine_allocate_batch(mc_engine_t engine, uint32_t capacity, mc_batch_t *out, mc_error_t *err);

/* mc_engine_free_batch releases a batch; MC_TE_ERR_BATCH_BUSY while any
 * of its tasks is still running (the batch then stays allocated). */
mc_status_t mc_engine_free_batch(mc_engine_t engine, mc_batch_t batch, mc_error_t *err);

/* mc_engine_submit starts count requests as tasks of batch; task ids
 * continue from those already submitted to it, in order. All requests are
 * checked first; if one is bad none is submitted. Returns once queued. */
mc_status_t mc_engine_submit(mc_engine_t engine, mc_batch_t batch, const mc_request_t *requests,
                             size_t count, mc_error_t *err);

/* mc_engine_submit_with_notify is mc_engine_submit that, once every task of
 * the batch completed successfully, sends the notification
 * (notify_name, notify_msg) to the engine of the first request's segment
 * (Mooncake's submitTransferWithNotify). Both strings are UTF-8 text. */
mc_status_t mc_engine_submit_with_notify(mc_engine_t engine, mc_batch_t batch, const mc_request_t *requests,
                                         size_t count, const char *notify_name, const char *notify_msg,
                                         mc_error_t *err);

/* mc_engine_task_status stores the state of task task_id (its index in
 * submission order) of batch. */
mc_status_t mc_engine_task_status(mc_engine_t engine, mc_batch_t batch, uint64_t task_id,
                                  mc_transfer_status_t *out, mc_error_t *err);

/* mc_engine_batch_status sums up a batch: WAITING when empty, PENDING while
 * any task runs, then COMPLETED if all completed, else the first failure. */
mc_status_t mc_engine_batch_status(mc_engine_t engine, mc_batch_t batch, mc_transfer_status_t *out,
                                   mc_error_t *err);

/* mc_engine_wait blocks until every task of batch is final or timeout_ms
 * passes (timeout_ms < 0: no limit). It returns MC_OK when every task
 * completed; the code of the first failure (or MC_ERR_TRANSFER_FAILED)
 * when the batch finished otherwise; MC_ERR_TIMED_OUT when time ran out;
 * MC_ERR_CANCELED when the engine was destroyed meanwhile.
 * out (may be NULL) receives the batch summary in every case. */
mc_status_t mc_engine_wait(mc_engine_t engine, mc_batch_t batch, int64_t timeout_ms,
                           mc_transfer_status_t *out, mc_error_t *err);

/* mc_engine_send_notify delivers the notification (name, msg) to the engine
 * of an opened segment (Mooncake's genNotifyInEngine). Strings are UTF-8
 * text. */
mc_status_t mc_engine_send_notify(mc_engine_t engine, mc_segment_t segment, const char *name,
                                  const char *msg, mc_error_t *err);

/* mc_engine_get_notifies takes the notifications received so far (oldest
 * first) and clears them. On MC_OK *out is an array of *count_out entries
 * allocated by the library (NULL when there are none), which the caller
 * frees with mc_notifies_free. */
mc_status_t mc_engine_get_notifies(mc_engine_t engine, mc_notify_t **out, size_t *count_out, mc_error_t *err);

/* mc_notifies_free frees an array from mc_engine_get_notifies. NULL is a
 * no-op. */
void mc_notifies_free(mc_notify_t *notifies, size_t count);

/* ------------------------------------------------------------------------
 * Store
 * ------------------------------------------------------------------------ */

typedef uint64_t mc_store_t; /* opaque handle, 0 = none */

/* Store client configuration (Mooncake's setup arguments). Zero (NULL)
 * fields mean the default given. */
typedef struct mc_store_config {
    uint32_t struct_size; /* sizeof(mc_store_config_t); see VERSIONING */
    uint32_t replicas;    /* default replicas per put; 0: 1 */
    /* the master: "host:port", or "etcd://h1:2379;h2:2379" to follow the HA
     * leader. Required. */
    const char *master;
    /* the address peers reach this client's engine at (Mooncake's
     * local_hostname; "host" or "host:port", the port then being the
     * handshake port); NULL: the engine's default */
    const char *local_hostname;
    /* the engine's metadata (Mooncake's metadata_server); NULL: P2PHANDSHAKE */
    const char *metadata;
    /* Mooncake's protocol: "tcp" (NULL) and "rdma" (no hardware here) both
     * mean the engine's default data path, shared memory with peers on this
     * host and TCP elsewhere; "shm" keeps to shared memory */
    const char *protocol;
    /* HA cluster name in etcd; NULL: MC_STORE_CLUSTER_ID, else "mooncake_cluster" */
    const char *cluster_id;
    /* bytes this client contributes to the pool (global_segment_size);
     * 0: 512 MiB; -1: none (a client that only reads and writes) */
    int64_t segment_size;
    /* registered staging memory for unregistered buffers; 0: 128 MiB */
    int64_t local_buffer_size;
    uint64_t rpc_timeout_ms; /* per master call; 0: 30 s */
    /* an existing engine to move bytes with (it must outlive the store);
     * 0: the store starts and owns its own */
    mc_engine_t engine;
    uint32_t no_checksum; /* nonzero: no CRC-32C on put, no check on get */
    uint32_t reserved;    /* must be 0 */
    /* ABI 1.5 (MC_STORE_CONFIG_SIZE_V2): the limit of each call on the
     * store, from its start to its return, master calls and transfers
     * included; past it the call fails with MC_ERR_TIMED_OUT (the per-key
     * codes of a batch are the store's). 0: none beyond rpc_timeout_ms
     * per master call and the engine's per request. Each transfer is
     * also bounded by the engine's timeout (MC_TRANSFER_TIMEOUT, 30 s by
     * default): an op_timeout_ms above it does not let one run longer. */
    uint64_t op_timeout_ms;
    /* ABI 1.7 (MC_STORE_CONFIG_SIZE_V3): nonzero: a put (mc_store_put,
     * _put_from, the batch puts and puts of parts; not an upsert) of a key
     * that exists fails with MC_STORE_ERR_OBJECT_ALREADY_EXISTS, the value
     * stored left as it is. 0: it succeeds without writing, as Mooncake's
     * put does. */
    uint32_t report_existing;
    /* ABI 1.8 (MC_STORE_CONFIG_SIZE_V4): credentials for a master that
     * requires them (mooncake master --auth_token, --tls_*).
     * auth_token: the bearer token presented on every master call and to
     * an HTTP metadata server; NULL: the environment's MC_AUTH_TOKEN, else
     * none. tls_ca_file: a PEM CA bundle verifying the master, turning TLS
     * on; tls_cert_file and tls_key_file: the client certificate a master
     * with mutual TLS requires. NULL: plaintext, as Mooncake's.
     * te_secret: the Transfer Engine's shared secret, which every peer
     * must know, for the engine the store starts (not an existing engine,
     * which has its own); NULL: MC_TE_SECRET, else none. */
    const char *auth_token;
    const char *tls_ca_file;
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *te_secret;
    /* ABI 1.10 (MC_STORE_CONFIG_SIZE_V5): the tenant whose objects this
     * store puts and sees (Mooncake's tenant_id; docs/tenants.md): two
     * tenants never see each other's objects, even under the same key, and
     * the master holds each to its quota. Letters, digits and -_.:@/, at
     * most 128 bytes. NULL: MOONCAKE_TENANT_ID, else "default". */
    const char *tenant_id;
    /* ABI 1.12 (MC_STORE_CONFIG_SIZE_V6): the name the master's
     * certificate must carry, where it is not the host dialed (a
     * Kubernetes Service's name for masters reached at pod addresses, the
     * name the masters' own --ha_peer_server_name verifies). It needs TLS
     * on (tls_ca_file or a client certificate); alone it is refused.
     * NULL: the host of master, or of the leader etcd names. */
    const char *tls_server_name;
} mc_store_config_t;

/* Sizes of the versions of mc_store_config_t (see VERSIONING). */
#define MC_STORE_CONFIG_SIZE_V1 (offsetof(mc_store_config_t, reserved) + sizeof(uint32_t))        /* ABI 1.0 */
#define MC_STORE_CONFIG_SIZE_V2 (offsetof(mc_store_config_t, op_timeout_ms) + sizeof(uint64_t))   /* ABI 1.5 */
#define MC_STORE_CONFIG_SIZE_V3 (offsetof(mc_store_config_t, report_existing) + sizeof(uint32_t)) /* ABI 1.7 */
#define MC_STORE_CONFIG_SIZE_V4 (offsetof(mc_store_config_t, te_secret) + sizeof(const char *)) /* ABI 1.8 */
#define MC_STORE_CONFIG_SIZE_V5 (offsetof(mc_store_config_t, tenant_id) + sizeof(const char *)) /* ABI 1.10 */
#define MC_STORE_CONFIG_SIZE_V6 (offsetof(mc_store_config_t, tls_server_name) + sizeof(const char *)) /* ABI 1.12 */

/* mc_store_config_init zeroes *cfg and sets struct_size. */
static inline void mc_store_config_init(mc_store_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = (uint32_t)sizeof *cfg;
}

/* How one put is replicated (Mooncake's ReplicateConfig). Passing NULL
 * where one is taken means the store's default. */
typedef struct mc_replicate_config {
    uint32_t struct_size;    /* sizeof(mc_replicate_config_t); see VERSIONING */
    uint32_t replicas;       /* memory replicas on distinct segments; 0: 1 */
    uint32_t soft_pin;       /* nonzero: kept through eviction until the pin expires */
    uint32_t hard_pin;       /* nonzero: never evicted */
    uint64_t soft_pin_ttl_ms; /* 0: the master's default */
    uint32_t prefer_local;   /* nonzero: place on this host first */
    uint32_t n_preferred;    /* entries in preferred_segments */
    const char *const *preferred_segments; /* segment names to place on first */
    /* ABI 1.11 (MC_REPLICATE_CONFIG_SIZE_V2): pieces each replica is cut
     * into, on distinct segments (distinct hosts where possible), which a
     * get reads in parallel; best effort, fewer where fewer segments fit.
     * 1: none. 0: the master's policy (mooncake master --stripe_min_size,
     * --stripe_count). */
    uint32_t stripe_count;
} mc_replicate_config_t;

/* Sizes of the versions of mc_replicate_config_t (see VERSIONING). */
#define MC_REPLICATE_CONFIG_SIZE_V1 (offsetof(mc_replicate_config_t, preferred_segments) + sizeof(void *)) /* ABI 1.0 */
#define MC_REPLICATE_CONFIG_SIZE_V2 (offsetof(mc_replicate_config_t, stripe_count) + sizeof(uint32_t))     /* ABI 1.11 */

static inline void mc_replicate_config_init(mc_replicate_config_t *rc) {
    memset(rc, 0, sizeof *rc);
    rc->struct_size = (uint32_t)sizeof *rc;
}

/* mc_store_create connects a client to the master (Mooncake's setup): it
 * starts or adopts an engine, allocates the staging buffer and the segment
 * and mounts the segment. The client gets an SSD tier when the environment
 * says so at this call (getenv): MOONCAKE_ENABLE_SSD_OFFLOAD (or
 * MOONCAKE_OFFLOAD_ENABLED) true, MOONCAKE_OFFLOAD_FILE_STORAGE_PATH its
 * directory, MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES its size (16 GiB);
 * objects its file kept from an earlier run come back (docs/tiers-restarts.md). */
mc_status_t mc_store_create(const mc_store_config_t *cfg, mc_store_t *out, mc_error_t *err);

/* mc_store_close unmounts the segment (its replicas leave the pool), frees
 * what create allocated, closes the engine if it started it, and
 * invalidates the handle. Calls on the store in progress in other threads
 * are canceled: they return MC_ERR_CANCELED as soon as what they wait on
 * (the master, a transfer) gives up, and close returns once they have
 * (they may be copying from or into memory close frees). Calls made after
 * it fail with MC_ERR_INVALID_HANDLE. */
mc_status_t mc_store_close(mc_store_t store, mc_error_t *err);

/* mc_store_name writes the client's segment name (its engine's; Mooncake's
 * get_hostname) into buf; see the len_out protocol. */
mc_status_t mc_store_name(mc_store_t store, char *buf, size_t buf_len, size_t *len_out, mc_error_t *err);

/* mc_store_register_buffer registers [addr, addr+length) so that put_from
 * and get_into move bytes straight from/to it (no staging copy). The
 * memory must stay valid until unregistered or the store is closed. */
mc_status_t mc_store_register_buffer(mc_store_t store, void *addr, uint64_t length, mc_error_t *err);

/* mc_store_unregister_buffer undoes mc_store_register_buffer of addr. */
mc_status_t mc_store_unregister_buffer(mc_store_t store, void *addr, mc_error_t *err);

/* mc_store_put stores length bytes at value under key, write-once: when the
 * key exists the put succeeds without overwriting (or fails with
 * MC_STORE_ERR_OBJECT_ALREADY_EXISTS where the store's config set
 * report_existing). value may be any memory
 * (unregistered memory goes through the staging buffer). rc may be NULL. */
mc_status_t mc_store_put(mc_store_t store, const char *key, const void *value, uint64_t length,
                         const mc_replicate_config_t *rc, mc_error_t *err);

/* mc_store_put_from is mc_store_put of a value inside a registered buffer;
 * unregistered memory gives MC_STORE_ERR_INVALID_PARAMS. */
mc_status_t mc_store_put_from(mc_store_t store, const char *key, const void *buf, uint64_t length,
                              const mc_replicate_config_t *rc, mc_error_t *err);

/* mc_store_upsert stores value under key, replacing an existing value once
 * the new one is written (readers see the old or the new, never a mix). */
mc_status_t mc_store_upsert(mc_store_t store, const char *key, const void *value, uint64_t length,
                            const mc_replicate_config_t *rc, mc_error_t *err);

/* mc_store_get reads the value of key into buf (any memory) and stores its
 * length in *len_out. When the value is larger than buf_len nothing is
 * read, *len_out gets the value's length and the call returns
 * MC_ERR_BUFFER_TOO_SMALL, so buf may be NULL with buf_len 0 to ask for
 * the size. Absent key: MC_STORE_ERR_OBJECT_NOT_FOUND. */
mc_status_t mc_store_get(mc_store_t store, const char *key, void *buf, uint64_t buf_len, uint64_t *len_out,
                         mc_error_t *err);

/* mc_store_get_into reads the value of key into buf (registered memory is
 * read into directly, other memory through the staging buffer) and stores
 * its length in *len_out (may be NULL). A buffer smaller than the value
 * gives MC_STORE_ERR_INVALID_PARAMS. */
mc_status_t mc_store_get_into(mc_store_t store, const char *key, void *buf, uint64_t buf_len,
                              uint64_t *len_out, mc_error_t *err);

/* mc_store_get_size stores the length of key's value in *size_out. */
mc_status_t mc_store_get_size(mc_store_t store, const char *key, uint64_t *size_out, mc_error_t *err);

/* Batch forms. Each takes count keys and per-key buffers, and writes one
 * status per key into codes_out (count entries, may be NULL). They return
 * MC_OK when every key succeeded, else the first failing key's code (err
 * tells which key). A batch costs one master round trip per phase. */

/* mc_store_batch_put: mc_store_put of count objects (any memory). */
mc_status_t mc_store_batch_put(mc_store_t store, const char *const *keys, const void *const *values,
                               const uint64_t *lengths, size_t count, const mc_replicate_config_t *rc,
                               mc_status_t *codes_out, mc_error_t *err);

/* mc_store_batch_put_from: mc_store_put_from of count objects. */
mc_status_t mc_store_batch_put_from(mc_store_t store, const char *const *keys, const void *const *bufs,
                                    const uint64_t *lengths, size_t count, const mc_replicate_config_t *rc,
                                    mc_status_t *codes_out, mc_error_t *err);

/* mc_store_batch_upsert: mc_store_upsert of count objects. */
mc_status_t mc_store_batch_upsert(mc_store_t store, const char *const *keys, const void *const *values,
                                  const uint64_t *lengths, size_t count, const mc_replicate_config_t *rc,
                                  mc_status_t *codes_out, mc_error_t *err);

/* mc_store_batch_get_into: mc_store_get_into of count keys; buf_lens are the
 * capacities, lens_out (may be NULL) receives each value's length (0 on
 * failure). */
mc_status_t mc_store_batch_get_into(mc_store_t store, const char *const *keys, void *const *bufs,
                                    const uint64_t *buf_lens, size_t count, uint64_t *lens_out,
                                    mc_status_t *codes_out, mc_error_t *err);

/* mc_store_exist stores 1 in *exists_out when key is readable, else 0. */
mc_status_t mc_store_exist(mc_store_t store, const char *key, int32_t *exists_out, mc_error_t *err);

/* mc_store_batch_exist stores 1 or 0 per key in exists_out (count
 * entries); a key the master refused gets 0 and its code in codes_out. */
mc_status_t mc_store_batch_exist(mc_store_t store, const char *const *keys, size_t count, int32_t *exists_out,
                                 mc_status_t *codes_out, mc_error_t *err);

/* mc_store_remove deletes key. A leased object (recently read) gives
 * MC_STORE_ERR_OBJECT_HAS_LEASE unless force != 0. */
mc_status_t mc_store_remove(mc_store_t store, const char *key, int force, mc_error_t *err);

/* mc_store_batch_remove (ABI 1.2) is mc_store_remove of count keys in one
 * master round trip; codes_out (count entries, may be NULL) gets each key's
 * code, and the call returns the first failure. */
mc_status_t mc_store_batch_remove(mc_store_t store, const char *const *keys, size_t count, int force,
                                  mc_status_t *codes_out, mc_error_t *err);

/* mc_store_remove_all removes every readable object (leased ones only with
 * force) and stores how many in *removed_out (may be NULL). */
mc_status_t mc_store_remove_all(mc_store_t store, int force, uint64_t *removed_out, mc_error_t *err);

/* mc_store_remove_by_regex (ABI 1.2) removes the readable objects whose key
 * the RE2 pattern regex matches anywhere in it ("^prefix" for a prefix;
 * leased ones only with force) and stores how many in *removed_out (may be
 * NULL). A NULL, empty or invalid pattern is MC_STORE_ERR_INVALID_PARAMS. */
mc_status_t mc_store_remove_by_regex(mc_store_t store, const char *regex, int force, uint64_t *removed_out,
                                     mc_error_t *err);

/* Values made of parts (ABI 1.1; Mooncake's batch_put_from_multi_buffers
 * and batch_get_into_multi_buffers). The value of keys[i] is the
 * concatenation of part_counts[i] buffers, for example one per layer of a
 * KV cache. The parts of all keys are given in one flat array, key by key:
 * key 0's are parts[0 .. part_counts[0]), key 1's follow, and so on, with
 * their lengths in part_lens at the same indexes. Every part must lie
 * inside memory registered with mc_store_register_buffer (else that key
 * fails with MC_STORE_ERR_INVALID_PARAMS); the library moves the bytes from
 * and into the parts directly (no copy into one buffer), and the checksum
 * is that of the whole value, so a value put from parts can be read whole
 * with mc_store_get and the reverse. Zero-length parts are allowed (NULL
 * too when its length is 0). Per-key status and the return value are as
 * for the other batch forms. */

/* mc_store_batch_put_from_parts: mc_store_put_from of count values made of
 * parts (write-once, as mc_store_put); an empty value is
 * MC_STORE_ERR_INVALID_PARAMS. */
mc_status_t mc_store_batch_put_from_parts(mc_store_t store, const char *const *keys, const void *const *parts,
                                          const uint64_t *part_lens, const size_t *part_counts, size_t count,
                                          const mc_replicate_config_t *rc, mc_status_t *codes_out,
                                          mc_error_t *err);

/* mc_store_batch_get_into_parts reads the value of keys[i] across its parts
 * in order: its first part receives the value's first bytes (as many as
 * the part's length), the next part the bytes after those, and so on. A value longer than its parts together fails with
 * MC_STORE_ERR_INVALID_PARAMS and nothing is read; a shorter one fills a
 * prefix of them (bytes past it are left as they were). lens_out (may be
 * NULL) receives each value's length (0 on failure). */
mc_status_t mc_store_batch_get_into_parts(mc_store_t store, const char *const *keys, void *const *parts,
                                          const uint64_t *part_lens, const size_t *part_counts, size_t count,
                                          uint64_t *lens_out, mc_status_t *codes_out, mc_error_t *err);

/* ------------------------------------------------------------------------
 * Ranged reads, get sessions, replica descriptors (ABI 1.3)
 * ------------------------------------------------------------------------ */

/* mc_store_batch_get_ranges reads pieces of values (Mooncake's
 * batch_get_into_multi_buffer_ranges): for keys[i], range_counts[i]
 * ranges, given in flat arrays key by key as the parts above. Range j
 * reads lens[j] bytes of the value, from byte src_offsets[j] on, into
 * bufs[j] (registered memory is read into directly, other memory through
 * the local buffer). A range that reaches past the end of its value fails
 * its key with MC_STORE_ERR_INVALID_PARAMS and nothing of that key is
 * read. The pieces are not checked against the object's checksum (it
 * covers the whole value). lens_out (may be NULL) receives the bytes read
 * per key (the sum of its ranges' lengths; 0 on failure). Per-key status
 * and the return value are as for the other batch forms. */
mc_status_t mc_store_batch_get_ranges(mc_store_t store, const char *const *keys, void *const *bufs,
                                      const uint64_t *lens, const uint64_t *src_offsets,
                                      const size_t *range_counts, size_t count, uint64_t *lens_out,
                                      mc_status_t *codes_out, mc_error_t *err);

/* mc_store_batch_get_session_start looks up the replicas of count keys in
 * one master round trip and keeps them, for the lease the master grants
 * with them, so that the reads that follow (ranged reads layer by layer,
 * say) go straight to the replicas. codes_out receives MC_OK or why a key
 * is not readable (MC_STORE_ERR_OBJECT_NOT_FOUND, ...). A session needs
 * no end to be correct: past its lease, reads look the key up again. */
mc_status_t mc_store_batch_get_session_start(mc_store_t store, const char *const *keys, size_t count,
                                             mc_status_t *codes_out, mc_error_t *err);

/* mc_store_batch_get_session_end forgets what
 * mc_store_batch_get_session_start kept for keys (a local call). */
mc_status_t mc_store_batch_get_session_end(mc_store_t store, const char *const *keys, size_t count,
                                           mc_error_t *err);

/* Where a replica lives (mc_replica_desc_t.kind). */
enum {
    MC_REPLICA_MEMORY = 0,     /* DRAM of a client's segment */
    MC_REPLICA_DISK = 1,       /* a file (file_path) */
    MC_REPLICA_LOCAL_DISK = 2  /* the SSD tier of the client named segment_name */
};

/* MC_REPLICA_NAME_SIZE bounds the strings of mc_replica_desc_t (NUL
 * included; longer ones are cut). */
#define MC_REPLICA_NAME_SIZE 256

/* mc_replica_desc_t describes one replica of an object (Mooncake's
 * ReplicaDescriptor). status is Mooncake's ReplicaStatus: 0 undefined,
 * 1 initialized, 2 processing, 3 complete, 4 removed, 5 failed.
 * A striped replica (mc_replicate_config_t.stripe_count), whose bytes lie
 * in pieces on several segments, is described by its first piece: its
 * segment_name, transport_endpoint and buffer_address, and size the
 * piece's length, less than the value's. The bytes at buffer_address are
 * then the value's first size bytes; the rest lie in the other pieces,
 * which this fixed struct cannot name (gets read them all). */
typedef struct mc_replica_desc {
    int32_t kind;      /* MC_REPLICA_* */
    int32_t status;
    uint64_t buffer_address; /* memory kinds: address in the segment owner */
    uint64_t size;           /* bytes the replica holds at buffer_address */
    char segment_name[MC_REPLICA_NAME_SIZE];
    char transport_endpoint[MC_REPLICA_NAME_SIZE]; /* host:port of its engine */
    char file_path[MC_REPLICA_NAME_SIZE];          /* MC_REPLICA_DISK only */
} mc_replica_desc_t;

/* mc_store_get_replicas stores the complete replicas of key, on any tier,
 * in out[0 .. cap) and their number in *count_out. More than cap:
 * MC_ERR_BUFFER_TOO_SMALL, with *count_out the number needed and out
 * filled up to cap. A missing key, or one whose first put is still in
 * flight, is MC_STORE_ERR_OBJECT_NOT_FOUND. Like a get, the lookup grants
 * a lease. */
mc_status_t mc_store_get_replicas(mc_store_t store, const char *key, mc_replica_desc_t *out, size_t cap,
                                  size_t *count_out, mc_error_t *err);

/* ------------------------------------------------------------------------
 * Put sessions (ABI 1.4)
 *
 * A put taken apart, for values whose bytes become available piece by
 * piece (a KV cache written layer by layer): the session start reserves
 * the objects' space with the master, the ranged writes that follow go
 * straight to the reserved replicas with no master round trip, and the
 * session end makes the objects readable (Mooncake's
 * batch_put_session_start, batch_put_from_multi_buffer_ranges,
 * batch_put_session_end and batch_put_session_revoke). Sessions belong to
 * the store handle; mc_store_close revokes those still open. The object's
 * checksum is computed from the pieces when they cover the value exactly
 * once; otherwise (a gap, an overlap, a failed write) the value is sealed
 * without one, as with no_checksum.
 * ------------------------------------------------------------------------ */

/* mc_store_batch_put_session_start reserves count objects of sizes[i]
 * bytes under keys[i] (write-once: nothing is overwritten), in one master
 * round trip; they are not readable until their session ends. Per key:
 * MC_STORE_ERR_INVALID_PARAMS for an empty key, a size of 0 or a key whose
 * session is open; MC_STORE_ERR_OBJECT_ALREADY_EXISTS for a key that
 * exists or comes twice; MC_STORE_ERR_NO_AVAILABLE_HANDLE when the pool is
 * full. rc NULL is the store's default replication. */
mc_status_t mc_store_batch_put_session_start(mc_store_t store, const char *const *keys, const uint64_t *sizes,
                                             size_t count, const mc_replicate_config_t *rc, mc_status_t *codes_out,
                                             mc_error_t *err);

/* mc_store_batch_put_ranges writes pieces of the values of open sessions:
 * for keys[i], range_counts[i] ranges, given in flat arrays key by key as
 * the parts above. Range j writes lens[j] bytes from bufs[j] at byte
 * dst_offsets[j] of the value, in every replica (registered memory is
 * written from directly, other memory through the local buffer). Ranges
 * may come in any order, in as many calls as wanted; the last write of a
 * byte wins. A key without an open session, or a range past the size
 * given at the start, fails with MC_STORE_ERR_INVALID_PARAMS and nothing
 * of that key is written. lens_out (may be NULL) receives the bytes
 * written per key (the sum of its ranges' lengths; 0 on failure). */
mc_status_t mc_store_batch_put_ranges(mc_store_t store, const char *const *keys, const void *const *bufs,
                                      const uint64_t *lens, const uint64_t *dst_offsets,
                                      const size_t *range_counts, size_t count, uint64_t *lens_out,
                                      mc_status_t *codes_out, mc_error_t *err);

/* mc_store_batch_put_session_end makes the objects of keys readable once
 * the ranged writes in progress on them are done, and closes their
 * sessions (one master round trip). Bytes never written read as whatever
 * the replica held. A key without an open session is
 * MC_STORE_ERR_INVALID_PARAMS; a key whose end the master refuses keeps
 * its session, to end again or revoke. */
mc_status_t mc_store_batch_put_session_end(mc_store_t store, const char *const *keys, size_t count,
                                           mc_status_t *codes_out, mc_error_t *err);

/* mc_store_batch_put_session_revoke gives back the space reserved for the
 * objects of keys, once the ranged writes in progress on them are done,
 * and closes their sessions: the objects never become readable. A key
 * without an open session is MC_STORE_ERR_INVALID_PARAMS; otherwise the
 * code is the master's answer, and the session is closed whatever it is. */
mc_status_t mc_store_batch_put_session_revoke(mc_store_t store, const char *const *keys, size_t count,
                                              mc_status_t *codes_out, mc_error_t *err);

/* ------------------------------------------------------------------------
 * Dummy clients (ABI 1.9)
 *
 * A dummy client holds no segment and no engine: it forwards every call to
 * the real client on this host (`mooncake client`, the official
 * mooncake_client) and shares that client's pool, as the official
 * setup_dummy does; the tensor-parallel ranks of one server each open one.
 * Its memory pool (mc_dummy_alloc) and staging buffer are shared memory
 * with the real client: a value in the pool, or in memory registered with
 * mc_dummy_register_shared, moves without a copy; any other buffer is
 * copied once through staging, and one larger than the
 * staging buffer is MC_STORE_ERR_INVALID_PARAMS. When the real client
 * dies, calls fail at once with MC_STORE_ERR_RPC_FAIL. Calls on one dummy
 * are serialized; a dummy is safe to share between threads. Codes and
 * ownership are those of the store functions of the same names.
 * See docs/client-modes.md.
 * ------------------------------------------------------------------------ */

typedef uint64_t mc_dummy_t; /* opaque handle, 0 = none */

/* mc_dummy_create connects to the real client that server_address names
 * ("host:port", the port of `mooncake client --port`, 50052 by default;
 * or a unix socket path, or "@abstract-name") and asks for mem_pool_size
 * bytes of pool and local_buffer_size bytes of staging buffer. */
mc_status_t mc_dummy_create(const char *server_address, uint64_t mem_pool_size, uint64_t local_buffer_size,
                            mc_dummy_t *out, mc_error_t *err);

/* mc_dummy_close waits for the calls in progress, hangs up (the real
 * client frees the shared memory) and releases the handle; buffers from
 * mc_dummy_alloc are gone with it. */
mc_status_t mc_dummy_close(mc_dummy_t dummy, mc_error_t *err);

/* mc_dummy_alloc stores in *addr_out size bytes of the pool, 4096-aligned:
 * MC_STORE_ERR_NO_AVAILABLE_HANDLE when the pool has no room.
 * mc_dummy_free gives them back. */
mc_status_t mc_dummy_alloc(mc_dummy_t dummy, uint64_t size, void **addr_out, mc_error_t *err);
mc_status_t mc_dummy_free(mc_dummy_t dummy, void *addr, mc_error_t *err);

/* mc_dummy_register_shared makes length bytes at addr, which are the
 * mapping (MAP_SHARED) of the bytes at offset (page-aligned) of the file
 * fd (a memfd, say), known to the real client, which maps the same pages:
 * puts from and gets into them then copy nothing in this process. fd stays
 * the caller's. mc_dummy_unregister_shared undoes it for the region that
 * starts at addr. */
mc_status_t mc_dummy_register_shared(mc_dummy_t dummy, int fd, uint64_t offset, void *addr, uint64_t length,
                                     mc_error_t *err);
mc_status_t mc_dummy_unregister_shared(mc_dummy_t dummy, void *addr, mc_error_t *err);

/* mc_dummy_batch_put: mc_store_batch_put_from (upsert 0) or
 * mc_store_batch_upsert (upsert 1) through the real client. */
mc_status_t mc_dummy_batch_put(mc_dummy_t dummy, const char *const *keys, const void *const *values,
                               const uint64_t *lens, size_t count, int upsert, const mc_replicate_config_t *rc,
                               mc_status_t *codes_out, mc_error_t *err);

/* mc_dummy_batch_get_into: mc_store_batch_get_into through the real client. */
mc_status_t mc_dummy_batch_get_into(mc_dummy_t dummy, const char *const *keys, void *const *bufs,
                                    const uint64_t *buf_lens, size_t count, uint64_t *lens_out,
                                    mc_status_t *codes_out, mc_error_t *err);

/* mc_dummy_batch_exist, mc_dummy_get_size, mc_dummy_batch_remove,
 * mc_dummy_remove_all: the store functions of the same names through the
 * real client. */
mc_status_t mc_dummy_batch_exist(mc_dummy_t dummy, const char *const *keys, size_t count, int32_t *exists_out,
                                 mc_status_t *codes_out, mc_error_t *err);
mc_status_t mc_dummy_get_size(mc_dummy_t dummy, const char *key, uint64_t *size_out, mc_error_t *err);
mc_status_t mc_dummy_batch_remove(mc_dummy_t dummy, const char *const *keys, size_t count, int force,
                                  mc_status_t *codes_out, mc_error_t *err);
mc_status_t mc_dummy_remove_all(mc_dummy_t dummy, int force, uint64_t *removed_out, mc_error_t *err);

/* ------------------------------------------------------------------------
 * Diagnostics
 * ------------------------------------------------------------------------ */

/* mc_debug_panic panics inside the library on purpose and returns the
 * recovered MC_ERR_PANIC: bindings use it to check that a panic never
 * takes the process down. It names no handle, so it poisons none. */
mc_status_t mc_debug_panic(mc_error_t *err);

/* mc_debug_live_handles stores the number of live engine and store handles
 * (either pointer may be NULL): tests use it to check for leaks. */
mc_status_t mc_debug_live_handles(uint64_t *engines, uint64_t *stores, mc_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* MOONCAKE_H */
