/*
 * transfer_engine_c.h - Mooncake's Transfer Engine C API, served by
 * libmooncake.so (also installed as libtransfer_engine.so).
 *
 * The names, structs, constants and return values are those of Mooncake's
 * mooncake-transfer-engine/include/transfer_engine_c.h, so programs built
 * against Mooncake (NIXL's Mooncake plugin, TensorRT-LLM's Mooncake agent)
 * link and run against this library unchanged. mooncake.h is the library's
 * native, versioned API; this one exists for compatibility.
 *
 * Conventions, as Mooncake's:
 *   - int results are 0 on success and a negative Mooncake error code
 *     (error.h: -1 invalid argument, -3 address not registered, -4 batch
 *     busy, -102 socket, ...) on failure;
 *   - createTransferEngine returns NULL, openSegment a negative value and
 *     allocateBatchID INVALID_BATCH on failure;
 *   - strings passed in are read during the call only;
 *   - getNotifsFromEngine returns malloc'd memory that the caller releases
 *     with freeNotifsMsgBuf.
 * Beyond Mooncake's: a NULL, destroyed or made-up transfer_engine_t is
 * answered with -1 (NULL, INVALID_BATCH) instead of a crash, every call is
 * safe from any thread, and an internal panic is returned as -1 (after
 * which every call on that engine returns -1: mooncake.h, Panics).
 * destroyTransferEngine from another thread ends an openSegment blocked on
 * a silent peer at once (-1) rather than after its timeout. A process
 * may load the library and fork before its first call; in the child of a
 * fork after it, every call that needs the engine fails at once the same
 * way, and the first one says why on stderr (mooncake.h, Fork).
 *
 * Not available (no such transports here): installTransport returns NULL,
 * uninstallTransport and registerLocalFile return -303 (not implemented),
 * supportFileBuffer returns false.
 */
#ifndef TRANSFER_ENGINE_C
#define TRANSFER_ENGINE_C

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define segment_handle_t int32_t
#define segment_id_t int32_t
#define file_id_t uint32_t
#define batch_id_t uint64_t
#define LOCAL_SEGMENT (0)
#define INVALID_BATCH UINT64_MAX

#define OPCODE_READ (0)
#define OPCODE_WRITE (1)

/* One transfer: length bytes between local memory at source and the remote
 * virtual address target_offset in segment target_id. file_id is unused
 * (file buffers are not supported) and may be left uninitialised. */
struct transfer_request {
    int opcode;
    void *source;
    segment_id_t target_id;
    file_id_t file_id;
    uint64_t target_offset;
    uint64_t length;
};
typedef struct transfer_request transfer_request_t;

/* A notification: the sender's name and a message, both NUL-terminated. */
struct notify_msg {
    char *name;
    char *msg;
};
typedef struct notify_msg notify_msg_t;

#define STATUS_WAITING (0)
#define STATUS_PENDING (1)
#define STATUS_INVALID (2)
#define STATUS_CANCELED (3)
#define STATUS_COMPLETED (4)
#define STATUS_TIMEOUT (5)
#define STATUS_FAILED (6)

struct transfer_status {
    int status; /* STATUS_* */
    uint64_t transferred_bytes;
};
typedef struct transfer_status transfer_status_t;

/* Declared for source compatibility; no function here takes one. */
struct segment_desc {
    int type;
    union {
        struct {
            void *addr;
            uint64_t size;
            const char *location;
        } rdma;
        struct {
            const char *file_path;
            const char *subsystem_name;
            const char *proto;
            const char *ip;
            uint64_t port;
        } nvmeof;
    } desc_;
};
typedef struct segment_desc segment_desc_t;

struct buffer_entry {
    void *addr;
    size_t length;
};
typedef struct buffer_entry buffer_entry_t;

typedef void *transfer_engine_t;
typedef void *transport_t;

/* createTransferEngine starts an engine. metadata_conn_string is
 * "P2PHANDSHAKE", "etcd://h:p", "http://h:p/metadata" or "memory://name";
 * local_server_name names the engine (in P2PHANDSHAKE mode the name becomes
 * "<host>:<rpc port>"); ip_or_host_name (may be "" or NULL) is the address
 * peers reach it at; rpc_port 0 picks a free handshake port. auto_discover
 * is accepted and ignored (there are no devices to discover). MC_FORCE_TCP=1
 * in the environment keeps every transfer on TCP. Returns NULL on failure. */
transfer_engine_t createTransferEngine(const char *metadata_conn_string, const char *local_server_name,
                                       const char *ip_or_host_name, uint64_t rpc_port, int auto_discover);

/* getLocalIpAndPort writes the engine's segment name ("ip:port") into
 * buf_out (truncated to buf_len, NUL-terminated). */
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);

transport_t installTransport(transfer_engine_t engine, const char *proto, void **args);
int uninstallTransport(transfer_engine_t engine, const char *proto);

/* openSegment resolves a peer's segment by name and returns its id (>= 0),
 * or a negative error code. */
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);

/* openSegmentNoCache is openSegment after forgetting a cached descriptor of
 * the segment, so that the peer's current buffers are fetched. */
segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name);

int closeSegment(transfer_engine_t engine, segment_id_t segment_id);

/* removeLocalSegment is accepted for compatibility; the engine's segment
 * record goes away with destroyTransferEngine. Returns 0. */
int removeLocalSegment(transfer_engine_t engine, const char *segment_name);

void destroyTransferEngine(transfer_engine_t engine);

int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible);
int unregisterLocalMemory(transfer_engine_t engine, void *addr);

/* The batch forms register every entry remote-accessible, stopping at the
 * first failure (entries before it stay registered), as Mooncake. */
int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list, size_t buffer_len,
                             const char *location);
int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len);

bool supportFileBuffer(transfer_engine_t engine);
int registerLocalFile(transfer_engine_t engine, const char *path, size_t size, file_id_t *id);
int unregisterLocalFile(transfer_engine_t engine, const char *path);

batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);

int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                   size_t count);

/* submitTransferWithNotify sends notify_msg to the engine of the first
 * entry's segment once every task of the batch has completed. */
int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                             size_t count, notify_msg_t notify_msg);

/* getNotifsFromEngine takes the notifications received so far. It stores
 * their number in *size and returns a malloc'd array of them (NULL when
 * there are none), to be released with freeNotifsMsgBuf. */
notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size);
int freeNotifsMsgBuf(notify_msg_t *msg, int size);

/* genNotifyInEngine sends notify_msg to the engine of segment target_id. */
int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg);

int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status *status);

/* freeBatchID returns -4 (batch busy) while tasks of the batch run. */
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);

/* syncSegmentCache returns 0: descriptors are fetched when a segment is
 * opened (openSegmentNoCache refetches one). */
int syncSegmentCache(transfer_engine_t engine);

/* Also in recent Mooncake releases; here they do nothing and return 0
 * (showLinks writes an empty list). */
int discoverTopology(transfer_engine_t engine);
void enableGracefulShutdown(transfer_engine_t engine);
int warmupEfaSegment(transfer_engine_t engine, const char *segment_name);
int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFER_ENGINE_C */
