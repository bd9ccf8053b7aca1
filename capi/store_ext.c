// The public functions of ABI 1.3 and 1.4 (store_ext.go): each calls its Go export
// with the const qualifiers of include/mooncake.h dropped, as shim.c does.

#include "mooncake.h"
#include "_cgo_export.h"

mc_status_t mc_store_batch_get_ranges(mc_store_t store, const char *const *keys, void *const *bufs,
                                      const uint64_t *lens, const uint64_t *src_offsets,
                                      const size_t *range_counts, size_t count, uint64_t *lens_out,
                                      mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchGetRanges(store, (char **)keys, (void **)bufs, (uint64_t *)lens, (uint64_t *)src_offsets,
                                   (size_t *)range_counts, count, lens_out, codes_out, err);
}

mc_status_t mc_store_batch_get_session_start(mc_store_t store, const char *const *keys, size_t count,
                                             mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchGetSessionStart(store, (char **)keys, count, codes_out, err);
}

mc_status_t mc_store_batch_get_session_end(mc_store_t store, const char *const *keys, size_t count,
                                           mc_error_t *err) {
    return mcgoStoreBatchGetSessionEnd(store, (char **)keys, count, err);
}

mc_status_t mc_store_get_replicas(mc_store_t store, const char *key, mc_replica_desc_t *out, size_t cap,
                                  size_t *count_out, mc_error_t *err) {
    return mcgoStoreGetReplicas(store, (char *)key, out, cap, count_out, err);
}

mc_status_t mc_store_batch_put_session_start(mc_store_t store, const char *const *keys, const uint64_t *sizes,
                                             size_t count, const mc_replicate_config_t *rc, mc_status_t *codes_out,
                                             mc_error_t *err) {
    return mcgoStoreBatchPutSessionStart(store, (char **)keys, (uint64_t *)sizes, count, (mc_replicate_config_t *)rc,
                                         codes_out, err);
}

mc_status_t mc_store_batch_put_ranges(mc_store_t store, const char *const *keys, const void *const *bufs,
                                      const uint64_t *lens, const uint64_t *dst_offsets,
                                      const size_t *range_counts, size_t count, uint64_t *lens_out,
                                      mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchPutRanges(store, (char **)keys, (void **)bufs, (uint64_t *)lens, (uint64_t *)dst_offsets,
                                   (size_t *)range_counts, count, lens_out, codes_out, err);
}

mc_status_t mc_store_batch_put_session_end(mc_store_t store, const char *const *keys, size_t count,
                                           mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchPutSessionEnd(store, (char **)keys, count, codes_out, err);
}

mc_status_t mc_store_batch_put_session_revoke(mc_store_t store, const char *const *keys, size_t count,
                                              mc_status_t *codes_out, mc_error_t *err) {
    return mcgoStoreBatchPutSessionRevoke(store, (char **)keys, count, codes_out, err);
}
