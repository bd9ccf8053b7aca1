// store_backend.h: MOONCAKE_STORE, a NIXL backend that keeps objects in
// Mooncake Store through mooncake-go's C ABI (include/mooncake.h).
//
// NIXL's object model: an agent registers OBJ_SEG descriptors whose
// metaInfo is an object key (devId names the key when metaInfo is empty)
// and DRAM_SEG buffers; a loopback transfer (remote agent = this agent)
// WRITEs DRAM into objects (a store upsert) or READs objects into DRAM (a
// ranged store get: len bytes at the descriptor's addr, the offset in the
// object). queryMem reports which keys exist. DRAM buffers are registered
// with the store client, so the bytes move straight between them and the
// store's replicas (no staging copy).
//
// Parameters (all strings): master_server_address (the master, "host:port";
// default $MOONCAKE_MASTER), global_segment_size (bytes this agent adds to
// the pool; "0"/unset: the library's 512 MiB, "-1": none) and
// local_buffer_size (staging memory for unregistered buffers; unset: 128
// MiB); also rpc_timeout_ms (per master call; unset: 30 s), which bounds
// how long a transfer or query waits for a master that is down. Sizes
// take a KiB/MiB/GiB (or KB/MB/GB, K/M/G) suffix.
#ifndef MOONCAKE_GO_NIXL_STORE_BACKEND_H
#define MOONCAKE_GO_NIXL_STORE_BACKEND_H

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "backend/backend_engine.h"
#include "mooncake.h"

class nixlMooncakeStoreEngine : public nixlBackendEngine {
public:
    explicit nixlMooncakeStoreEngine(const nixlBackendInitParams *init_params);
    ~nixlMooncakeStoreEngine() override;

    // Objects live in the store, reached from this agent only: loopback
    // transfers, no peers, no notifications.
    bool
    supportsRemote() const override {
        return false;
    }

    bool
    supportsLocal() const override {
        return true;
    }

    bool
    supportsNotif() const override {
        return false;
    }

    nixl_mem_list_t
    getSupportedMems() const override {
        return {DRAM_SEG, OBJ_SEG};
    }

    nixl_status_t
    registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) override;
    nixl_status_t
    deregisterMem(nixlBackendMD *meta) override;

    nixl_status_t
    connect(const std::string &) override {
        return NIXL_SUCCESS;
    }

    nixl_status_t
    disconnect(const std::string &) override {
        return NIXL_SUCCESS;
    }

    nixl_status_t
    loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) override;
    nixl_status_t
    unloadMD(nixlBackendMD *input) override;

    nixl_status_t
    prepXfer(const nixl_xfer_op_t &operation,
             const nixl_meta_dlist_t &local,
             const nixl_meta_dlist_t &remote,
             const std::string &remote_agent,
             nixlBackendReqH *&handle,
             const nixl_opt_b_args_t *opt_args = nullptr) const override;
    nixl_status_t
    postXfer(const nixl_xfer_op_t &operation,
             const nixl_meta_dlist_t &local,
             const nixl_meta_dlist_t &remote,
             const std::string &remote_agent,
             nixlBackendReqH *&handle,
             const nixl_opt_b_args_t *opt_args = nullptr) const override;
    nixl_status_t
    checkXfer(nixlBackendReqH *handle) const override;
    nixl_status_t
    releaseReqH(nixlBackendReqH *handle) const override;

    nixl_status_t
    queryMem(const nixl_reg_dlist_t &descs, std::vector<nixl_query_resp_t> &resp) const override;

private:
    struct request;

    std::string
    param(const std::string &key) const;
    nixl_status_t
    run(request &req) const;

    mc_store_t store_ = 0;
    std::mutex mu_;
    // Registered DRAM: start address -> registrations of it. NIXL may
    // register one buffer more than once; the store registers it once.
    std::map<uintptr_t, int> dram_refs_;
};

#endif
