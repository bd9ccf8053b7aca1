//go:build ignore

/* The public C functions of libmooncake.so. Not part of the Go build (the
 * constraint above): scripts/build-capi.sh compiles this file, loader.c and
 * the forwarders it generates into libmooncake.so, which loads the Go
 * library (libmooncake_go.so) at the first call that needs Go.
 *
 * Each function calls a Go export (mcgo*, declared in _cgo_export.h; in
 * libmooncake.so that name is a forwarder that loads the Go library and
 * calls through) with plain C types: the public names keep
 * their const qualifiers, Mooncake's void* engine becomes the handle number
 * it carries, and the compiler checks both public headers against the Go
 * side. Functions that need no Go live here entirely, and work in any
 * process. */

#include <stdlib.h>
#include <string.h>

#include "mooncake.h"
#include "transfer_engine_c.h"
#include "_cgo_export.h"

/* ---- mooncake.h ---- */

uint32_t mc_abi_version(void) { return MC_ABI_VERSION; }

const char *mc_status_name(int32_t domain, mc_status_t code) {
    if (code == MC_OK) return "OK";
    switch (code) {
    case MC_ERR_INVALID_HANDLE: return "INVALID_HANDLE";
    case MC_ERR_NULL_ARGUMENT: return "NULL_ARGUMENT";
    case MC_ERR_PANIC: return "PANIC";
    case MC_ERR_BUFFER_TOO_SMALL: return "BUFFER_TOO_SMALL";
    case MC_ERR_TIMED_OUT: return "TIMED_OUT";
    case MC_ERR_STRUCT_SIZE: return "STRUCT_SIZE";
    case MC_ERR_TRANSFER_FAILED: return "TRANSFER_FAILED";
    case MC_ERR_CANCELED: return "CANCELED";
    }
    if (domain == MC_DOMAIN_ENGINE) {
        switch (code) {
        case MC_TE_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
        case MC_TE_ERR_TOO_MANY_REQUESTS: return "TOO_MANY_REQUESTS";
        case MC_TE_ERR_ADDRESS_NOT_REGISTERED: return "ADDRESS_NOT_REGISTERED";
        case MC_TE_ERR_BATCH_BUSY: return "BATCH_BUSY";
        case MC_TE_ERR_DEVICE_NOT_FOUND: return "DEVICE_NOT_FOUND";
        case MC_TE_ERR_ADDRESS_OVERLAPPED: return "ADDRESS_OVERLAPPED";
        case MC_TE_ERR_DNS: return "DNS";
        case MC_TE_ERR_SOCKET: return "SOCKET";
        case MC_TE_ERR_MALFORMED_JSON: return "MALFORMED_JSON";
        case MC_TE_ERR_REJECT_HANDSHAKE: return "REJECT_HANDSHAKE";
        case MC_TE_ERR_METADATA: return "METADATA";
        case MC_TE_ERR_ENDPOINT: return "ENDPOINT";
        case MC_TE_ERR_CONTEXT: return "CONTEXT";
        case MC_TE_ERR_NUMA: return "NUMA";
        case MC_TE_ERR_CLOCK: return "CLOCK";
        case MC_TE_ERR_MEMORY: return "MEMORY";
        case MC_TE_ERR_NOT_IMPLEMENTED: return "NOT_IMPLEMENTED";
        }
    } else if (domain == MC_DOMAIN_STORE) {
        switch (code) {
        case MC_STORE_ERR_INTERNAL: return "INTERNAL";
        case MC_STORE_ERR_SEGMENT_NOT_FOUND: return "SEGMENT_NOT_FOUND";
        case MC_STORE_ERR_NO_AVAILABLE_HANDLE: return "NO_AVAILABLE_HANDLE";
        case MC_STORE_ERR_INVALID_PARAMS: return "INVALID_PARAMS";
        case MC_STORE_ERR_OBJECT_NOT_FOUND: return "OBJECT_NOT_FOUND";
        case MC_STORE_ERR_OBJECT_ALREADY_EXISTS: return "OBJECT_ALREADY_EXISTS";
        case MC_STORE_ERR_OBJECT_HAS_LEASE: return "OBJECT_HAS_LEASE";
        case MC_STORE_ERR_LEASE_EXPIRED: return "LEASE_EXPIRED";
        case MC_STORE_ERR_TRANSFER_FAIL: return "TRANSFER_FAIL";
        case MC_STORE_ERR_CHECKSUM_MISMATCH: return "CHECKSUM_MISMATCH";
        case MC_STORE_ERR_RPC_FAIL: return "RPC_FAIL";
        case MC_STORE_ERR_RPC_TIMEOUT: return "RPC_TIMEOUT";
        case MC_STORE_ERR_ETCD_OPERATION_ERROR: return "ETCD_OPERATION_ERROR";
        }
    }
    return "UNKNOWN";
}

mc_status_t mc_engine_create(const mc_engine_config_t *cfg, mc_engine_t *out, mc_error_t *err) {
    return mcgoEngineCreate((mc_engine_config_t *)cfg, out, err);
}

mc_status_t mc_engine_destroy(mc_engine_t engine, mc_error_t *err) { return mcgoEngineDestroy(engine, err); }

mc_status_t mc_engine_name(mc_engine_t engine, char *buf, size_t buf_len, size_t *len_out, mc_error_t *err) {
    return mcgoEngineName(engine, buf, buf_len, len_out, err);
}

mc_status_t mc_engine_ports(mc_engine_t engine, uint32_t *rpc_port, uint32_t *data_port, mc_error_t *err) {
    return mcgoEnginePorts(engine, rpc_port, data_port, err);
}

mc_status_t mc_engine_register_memory(mc_engine_t engine, void *addr, uint64_t length, const char *location,
                                      int remote_accessible, mc_error_t *err) {
    return mcgoEngineRegisterMemory(engine, addr, length, (char *)location, remote_accessible, err);
}

mc_status_t mc_engine_unregister_memory(mc_engine_t engine, void *addr, mc_error_t *err) {
    return mcgoEngineUnregisterMemory(engine, addr, err);
}

mc_status_t mc_engine_allocate_buffer(mc_engine_t engine, uint64_t size, const char *location, void **addr_out,
                                      mc_error_t *err) {
    return mcgoEngineAllocateBuffer(engine, size, (char *)location, addr_out, err);
}

mc_status_t mc_engine_free_buffer(mc_engine_t engine, void *addr, mc_error_t *err) {
    return mcgoEngineFreeBuffer(engine, addr, err);
}

mc_status_t mc_engine_open_segment(mc_engine_t engine, const char *name, mc_segment_t *out, mc_error_t *err) {
    return mcgoEngineOpenSegment(engine, (char *)name, out, err);
}

mc_status_t mc_engine_close_segment(mc_engine_t engine, mc_segment_t segment, mc_error_t *err) {
    return mcgoEngineCloseSegment(engine, segment, err);
}

mc_status_t mc_engine_segment_buffers(mc_engine_t engine, mc_segment_t segment, mc_buffer_desc_t *out, size_t cap,
                                      size_t *count_out, mc_error_t *err) {
    return mcgoEngineSegmentBuffers(engine, segment, out, cap, count_out, err);
}

mc_status_t mc_engine_allocate_batch(mc_engine_t engine, uint32_t capacity, mc_batch_t *out, mc_error_t *err) {
    return mcgoEngineAllocateBatch(engine, capacity, out, err);
}

mc_status_t mc_engine_free_batch(mc_engine_t engine, mc_batch_t batch, mc_error_t *err) {
    return mcgoEngineFreeBatch(engine, batch, err);
}

mc_status_t mc_engine_submit(mc_engine_t engine, mc_batch_t batch, const mc_request_t *requests, size_t count,
                             mc_error_t *err) {
    return mcgoEngineSubmit(engine, batch, (mc_request_t *)requests, count, NULL, NULL, 0, err);
}

mc_status_t mc_engine_submit_with_notify(mc_engine_t engine, mc_batch_t batch, const mc_request_t *requests,
                                         size_t count, const char *notify_name, const char *notify_msg,
                                         mc_error_t *err) {
    return mcgoEngineSubmit(engine, batch, (mc_request_t *)requests, count, (char *)notify_name, (char *)notify_msg, 1,
                            err);
}

mc_status_t mc_engine_task_status(mc_engine_t engine, mc_batch_t batch, uint64_t task_id, mc_transfer_status_t *out,
                                  mc_error_t *err) {
    return mcgoEngineTaskStatus(engine, batch, task_id, out, err);
}

mc_status_t mc_engine_batch_status(mc_engine_t engine, mc_batch_t batch, mc_transfer_status_t *out, mc_error_t *err) {
    return mcgoEngineBatchStatus(engine, batch, out, err);
}

mc_status_t mc_engine_wait(mc_engine_t engine, mc_batch_t batch, int64_t timeout_ms, mc_transfer_status_t *out,
                           mc_error_t *err) {
    return mcgoEngineWait(engine, batch, timeout_ms, out, err);
}

mc_status_t mc_engine_send_notify(mc_engine_t engine, mc_segment_t segment, const char *name, const char *msg,
                                  mc_error_t *err) {
    return mcgoEngineSendNotify(engine, segment, (char *)name, (char *)msg, err);
}

mc_status_t mc_engine_get_notifies(mc_engine_t engine, mc_notify_t **out, size_t *count_out, mc_error_t *err) {
    return mcgoEngineGetNotifies(engine, out, count_out, err);
}

void mc_notifies_free(mc_notify_t *notifies, size_t count) {
    if (notifies == NULL) return;
    for (size_t i = 0; i < count; i++) {
        free(notifies[i].name);
        free(notifies[i].msg);
    }
    free(notifies);
}

mc_status_t mc_store_create(const mc_store_config_t *cfg, mc_store_t *out, mc_error_t *err) {
    return mcgoStoreCreate((mc_store_config_t *)cfg, out, err);
}

mc_status_t mc_store_close(mc_store_t store, mc_error_t *err) { return mcgoStoreClose(store, err); }

mc_status_t mc_store_name(mc_store_t store, char *buf, size_t buf_len, size_t *len_out, mc_error_t *err) {
    return mcgoStoreName(store, buf, buf_len, len_out, err);
}

mc_status_t mc_store_register_buffer(mc_store_t store, void *addr, uint64_t length, mc_error_t *err) {
    return mcgoStoreRegisterBuffer(store, addr, length, err);
}

mc_status_t mc_store_unregister_buffer(mc_store_t store, void *addr, mc_error_t *err) {
    return mcgoStoreUnregisterBuffer(store, addr, err);
}

mc_status_t mc_store_put(mc_store_t store, const char *key, const void *value, uint64_t length,
                         const mc_replicate_config_t *rc, mc_error_t *err) {
    return mcgoStorePut(store, (char *)key, (void *)value, length, (mc_replicate_config_t *)rc, err);
}

mc_status_t mc_copy(void *dst, const void *src, uint64_t n, mc_error_t *err) {
    return mcgoCopy(dst, (void *)src, n, err);
}

mc_status_t mc_store_put_from(mc_store_t store, const char *key, const void *buf, uint64_t length,
                              const mc_replicate_config_t *rc, mc_error_t *err) {
    return mcgoStorePutFrom(store, (char *)key, (void *)buf, length, (mc_replicate_config_t *)rc, err);
}

mc_status_t mc_store_upsert(mc_store_t store, const char *key, const void *value, uint64_t length,
                            const mc_replicate_config_t *rc, mc_error_t *err) {
    return mcgoStoreUpsert(store, (char *)key, (void *)value, length, (mc_replicate_config_t *)rc, err);
}

mc_status_t mc_store_get(mc_store_t store, const char *key, void *buf, uint64_t buf_len, uint64_t *len_out,
                         mc_error_t *err) {
    return mcgoStoreGet(store, (char *)key, buf, buf_len, len_out, err);
}

mc_status_t mc_store_get_into(mc_store_t store, const char *key, void *buf, uint64_t buf_len, uint64_t *len_out,
                              mc_error_t *err) {
    return mcgoStoreGetInto(store, (char *)key, buf, buf_len, len_out, err);
}

mc_status_t mc_store_get_size(mc_store_t store, const char *key, uint64_t *size_out, mc_error_t *err) {
    return mcgoStoreGetSize(store, (char *)key, size_out, err);
}

mc_status_t mc_store_batch_put(mc_store_t store, const char *const *keys, const void *const *values,
                               const uint64_t *lengths, size_t count, const mc_replicate_config_t *rc,
                               mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchPut(store, (char **)keys, (void **)values, (uint64_t *)lengths, count,
                             (mc_replicate_config_t *)rc, codes_out, err);
}

mc_status_t mc_store_batch_put_from(mc_store_t store, const char *const *keys, const void *const *bufs,
                                    const uint64_t *lengths, size_t count, const mc_replicate_config_t *rc,
                                    mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchPutFrom(store, (char **)keys, (void **)bufs, (uint64_t *)lengths, count,
                                 (mc_replicate_config_t *)rc, codes_out, err);
}

mc_status_t mc_store_batch_upsert(mc_store_t store, const char *const *keys, const void *const *values,
                                  const uint64_t *lengths, size_t count, const mc_replicate_config_t *rc,
                                  mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchUpsert(store, (char **)keys, (void **)values, (uint64_t *)lengths, count,
                                (mc_replicate_config_t *)rc, codes_out, err);
}

mc_status_t mc_store_batch_get_into(mc_store_t store, const char *const *keys, void *const *bufs,
                                    const uint64_t *buf_lens, size_t count, uint64_t *lens_out,
                                    mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchGetInto(store, (char **)keys, (void **)bufs, (uint64_t *)buf_lens, count, lens_out,
                                 codes_out, err);
}

mc_status_t mc_store_batch_put_from_parts(mc_store_t store, const char *const *keys, const void *const *parts,
                                          const uint64_t *part_lens, const size_t *part_counts, size_t count,
                                          const mc_replicate_config_t *rc, mc_status_t *codes_out,
                                          mc_error_t *err) {
    return mcgoStoreBatchPutFromParts(store, (char **)keys, (void **)parts, (uint64_t *)part_lens,
                                      (size_t *)part_counts, count, (mc_replicate_config_t *)rc, codes_out, err);
}

mc_status_t mc_store_batch_get_into_parts(mc_store_t store, const char *const *keys, void *const *parts,
                                          const uint64_t *part_lens, const size_t *part_counts, size_t count,
                                          uint64_t *lens_out, mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchGetIntoParts(store, (char **)keys, (void **)parts, (uint64_t *)part_lens,
                                      (size_t *)part_counts, count, lens_out, codes_out, err);
}

mc_status_t mc_store_exist(mc_store_t store, const char *key, int32_t *exists_out, mc_error_t *err) {
    return mcgoStoreExist(store, (char *)key, exists_out, err);
}

mc_status_t mc_store_batch_exist(mc_store_t store, const char *const *keys, size_t count, int32_t *exists_out,
                                 mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchExist(store, (char **)keys, count, exists_out, codes_out, err);
}

mc_status_t mc_store_remove(mc_store_t store, const char *key, int force, mc_error_t *err) {
    return mcgoStoreRemove(store, (char *)key, force, err);
}

mc_status_t mc_store_batch_remove(mc_store_t store, const char *const *keys, size_t count, int force,
                                  mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchRemove(store, (char **)keys, count, force, codes_out, err);
}

mc_status_t mc_store_remove_all(mc_store_t store, int force, uint64_t *removed_out, mc_error_t *err) {
    return mcgoStoreRemoveAll(store, force, removed_out, err);
}

mc_status_t mc_store_remove_by_regex(mc_store_t store, const char *regex, int force, uint64_t *removed_out,
                                     mc_error_t *err) {
    return mcgoStoreRemoveByRegex(store, (char *)regex, force, removed_out, err);
}

mc_status_t mc_debug_panic(mc_error_t *err) { return mcgoDebugPanic(err); }

mc_status_t mc_debug_live_handles(uint64_t *engines, uint64_t *stores, mc_error_t *err) {
    return mcgoDebugLiveHandles(engines, stores, err);
}

/* ---- transfer_engine_c.h ---- */

/* The handle number rides in Mooncake's void* engine; it is never a
 * pointer and never dereferenced. */
#define H(engine) ((uint64_t)(uintptr_t)(engine))

transfer_engine_t createTransferEngine(const char *metadata_conn_string, const char *local_server_name,
                                       const char *ip_or_host_name, uint64_t rpc_port, int auto_discover) {
    (void)auto_discover;
    uint64_t h = mcgoTeCreate((char *)metadata_conn_string, (char *)local_server_name, (char *)ip_or_host_name,
                              rpc_port);
    return (transfer_engine_t)(uintptr_t)h;
}

void destroyTransferEngine(transfer_engine_t engine) { mcgoTeDestroy(H(engine)); }

int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len) {
    return mcgoTeLocalIPAndPort(H(engine), buf_out, buf_len);
}

transport_t installTransport(transfer_engine_t engine, const char *proto, void **args) {
    (void)engine;
    (void)proto;
    (void)args;
    return NULL;
}

int uninstallTransport(transfer_engine_t engine, const char *proto) {
    (void)proto;
    int rc = mcgoTeCheck(H(engine));
    return rc ? rc : -303;
}

segment_id_t openSegment(transfer_engine_t engine, const char *segment_name) {
    return mcgoTeOpenSegment(H(engine), (char *)segment_name, 0);
}

segment_id_t openSegmentNoCache(transfer_engine_t engine, const char *segment_name) {
    return mcgoTeOpenSegment(H(engine), (char *)segment_name, 1);
}

int closeSegment(transfer_engine_t engine, segment_id_t segment_id) {
    return mcgoTeCloseSegment(H(engine), segment_id);
}

int removeLocalSegment(transfer_engine_t engine, const char *segment_name) {
    (void)segment_name;
    return mcgoTeCheck(H(engine));
}

int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                        int remote_accessible) {
    return mcgoTeRegister(H(engine), addr, length, (char *)location, remote_accessible);
}

int unregisterLocalMemory(transfer_engine_t engine, void *addr) { return mcgoTeUnregister(H(engine), addr); }

int registerLocalMemoryBatch(transfer_engine_t engine, buffer_entry_t *buffer_list, size_t buffer_len,
                             const char *location) {
    return mcgoTeRegisterBatch(H(engine), buffer_list, buffer_len, (char *)location);
}

int unregisterLocalMemoryBatch(transfer_engine_t engine, void **addr_list, size_t addr_len) {
    return mcgoTeUnregisterBatch(H(engine), addr_list, addr_len);
}

bool supportFileBuffer(transfer_engine_t engine) {
    (void)engine;
    return false;
}

int registerLocalFile(transfer_engine_t engine, const char *path, size_t size, file_id_t *id) {
    (void)path;
    (void)size;
    (void)id;
    int rc = mcgoTeCheck(H(engine));
    return rc ? rc : -303;
}

int unregisterLocalFile(transfer_engine_t engine, const char *path) {
    (void)path;
    int rc = mcgoTeCheck(H(engine));
    return rc ? rc : -303;
}

batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size) {
    return mcgoTeAllocateBatch(H(engine), batch_size);
}

int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries, size_t count) {
    return mcgoTeSubmit(H(engine), batch_id, entries, count, NULL, NULL, 0);
}

int submitTransferWithNotify(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request *entries,
                             size_t count, notify_msg_t notify_msg) {
    return mcgoTeSubmit(H(engine), batch_id, entries, count, notify_msg.name, notify_msg.msg, 1);
}

notify_msg_t *getNotifsFromEngine(transfer_engine_t engine, int *size) { return mcgoTeGetNotifs(H(engine), size); }

int freeNotifsMsgBuf(notify_msg_t *msg, int size) {
    if (msg == NULL) return 0;
    for (int i = 0; i < size; i++) {
        free(msg[i].name);
        free(msg[i].msg);
    }
    free(msg);
    return 0;
}

int genNotifyInEngine(transfer_engine_t engine, uint64_t target_id, notify_msg_t notify_msg) {
    return mcgoTeGenNotify(H(engine), target_id, notify_msg.name, notify_msg.msg);
}

int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id, struct transfer_status *status) {
    return mcgoTeStatus(H(engine), batch_id, task_id, status);
}

int freeBatchID(transfer_engine_t engine, batch_id_t batch_id) { return mcgoTeFreeBatch(H(engine), batch_id); }

int syncSegmentCache(transfer_engine_t engine) { return mcgoTeCheck(H(engine)); }

int discoverTopology(transfer_engine_t engine) { return mcgoTeCheck(H(engine)); }

void enableGracefulShutdown(transfer_engine_t engine) { (void)engine; }

int warmupEfaSegment(transfer_engine_t engine, const char *segment_name) {
    (void)segment_name;
    return mcgoTeCheck(H(engine));
}

int showLinks(transfer_engine_t engine, char *buf_out, size_t buf_len, int json) {
    if (buf_out == NULL || buf_len == 0) return -1;
    int rc = mcgoTeCheck(H(engine));
    if (rc) return rc;
    strncpy(buf_out, json ? "[]" : "", buf_len - 1);
    buf_out[buf_len - 1] = '\0';
    return 0;
}
