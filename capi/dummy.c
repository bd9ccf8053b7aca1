//go:build ignore

// The public functions of ABI 1.9, dummy clients (dummy.go): each calls its
// Go export with the const qualifiers of include/mooncake.h dropped, as
// shim.c does.

#include "mooncake.h"
#include "_cgo_export.h"

mc_status_t mc_dummy_create(const char *server_address, uint64_t mem_pool_size, uint64_t local_buffer_size,
                            mc_dummy_t *out, mc_error_t *err) {
    return mcgoDummyCreate((char *)server_address, mem_pool_size, local_buffer_size, out, err);
}

mc_status_t mc_dummy_close(mc_dummy_t dummy, mc_error_t *err) { return mcgoDummyClose(dummy, err); }

mc_status_t mc_dummy_alloc(mc_dummy_t dummy, uint64_t size, void **addr_out, mc_error_t *err) {
    return mcgoDummyAlloc(dummy, size, addr_out, err);
}

mc_status_t mc_dummy_free(mc_dummy_t dummy, void *addr, mc_error_t *err) { return mcgoDummyFree(dummy, addr, err); }

mc_status_t mc_dummy_register_shared(mc_dummy_t dummy, int fd, uint64_t offset, void *addr, uint64_t length,
                                     mc_error_t *err) {
    return mcgoDummyRegisterShared(dummy, fd, offset, addr, length, err);
}

mc_status_t mc_dummy_unregister_shared(mc_dummy_t dummy, void *addr, mc_error_t *err) {
    return mcgoDummyUnregisterShared(dummy, addr, err);
}

mc_status_t mc_dummy_batch_put(mc_dummy_t dummy, const char *const *keys, const void *const *values,
                               const uint64_t *lens, size_t count, int upsert, const mc_replicate_config_t *rc,
                               mc_status_t *codes_out, mc_error_t *err) {
    return mcgoDummyBatchPut(dummy, (char **)keys, (void **)values, (uint64_t *)lens, count, upsert,
                             (mc_replicate_config_t *)rc, codes_out, err);
}

mc_status_t mc_dummy_batch_get_into(mc_dummy_t dummy, const char *const *keys, void *const *bufs,
                                    const uint64_t *buf_lens, size_t count, uint64_t *lens_out,
                                    mc_status_t *codes_out, mc_error_t *err) {
    return mcgoDummyBatchGetInto(dummy, (char **)keys, (void **)bufs, (uint64_t *)buf_lens, count, lens_out,
                                 codes_out, err);
}

mc_status_t mc_dummy_batch_exist(mc_dummy_t dummy, const char *const *keys, size_t count, int32_t *exists_out,
                                 mc_status_t *codes_out, mc_error_t *err) {
    return mcgoDummyBatchExist(dummy, (char **)keys, count, exists_out, codes_out, err);
}

mc_status_t mc_dummy_get_size(mc_dummy_t dummy, const char *key, uint64_t *size_out, mc_error_t *err) {
    return mcgoDummyGetSize(dummy, (char *)key, size_out, err);
}

mc_status_t mc_dummy_batch_remove(mc_dummy_t dummy, const char *const *keys, size_t count, int force,
                                  mc_status_t *codes_out, mc_error_t *err) {
    return mcgoDummyBatchRemove(dummy, (char **)keys, count, force, codes_out, err);
}

mc_status_t mc_dummy_remove_all(mc_dummy_t dummy, int force, uint64_t *removed_out, mc_error_t *err) {
    return mcgoDummyRemoveAll(dummy, force, removed_out, err);
}
