// store_backend.cpp: the MOONCAKE_STORE engine (see store_backend.h).
#include "store_backend.h"

#include <cctype>
#include <cstdlib>
#include <future>
#include <optional>
#include <vector>

#include "common/nixl_log.h"

namespace {

// Metadata of a registered descriptor: a DRAM buffer (by its start) or an
// object (by its key). loadLocalMD hands the same object back, so NIXL's
// remote-side descriptors of a loopback transfer carry the key.
struct storeMD : public nixlBackendMD {
    storeMD(nixl_mem_t t, uintptr_t a, std::string k)
        : nixlBackendMD(true),
          type(t),
          addr(a),
          key(std::move(k)) {}

    nixl_mem_t type;
    uintptr_t addr;
    std::string key;
};

// objectKey is the key an OBJ_SEG descriptor names: its metaInfo, or its
// devId in decimal when metaInfo is empty.
std::string
objectKey(const nixlBlobDesc &d) {
    if (!d.metaInfo.empty()) {
        return std::string(d.metaInfo.begin(), d.metaInfo.end());
    }
    return std::to_string(d.devId);
}

// parseSize reads "123", "-1" or a size with a binary or decimal-looking
// unit (K, KB, KiB, M, MB, MiB, G, GB, GiB: all powers of 1024, as
// Mooncake's configuration reads them).
bool
parseSize(const std::string &s, int64_t &out) {
    size_t i = 0;
    bool neg = i < s.size() && s[i] == '-';
    if (neg) {
        i++;
    }
    if (i == s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) {
        return false;
    }
    int64_t v = 0;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); i++) {
        if (v > (INT64_MAX - 9) / 10) {
            return false;
        }
        v = v * 10 + (s[i] - '0');
    }
    std::string unit = s.substr(i);
    for (auto &c : unit) {
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    int64_t mul = 1;
    if (unit == "K" || unit == "KB" || unit == "KIB") {
        mul = int64_t(1) << 10;
    } else if (unit == "M" || unit == "MB" || unit == "MIB") {
        mul = int64_t(1) << 20;
    } else if (unit == "G" || unit == "GB" || unit == "GIB") {
        mul = int64_t(1) << 30;
    } else if (!unit.empty() && unit != "B") {
        return false;
    }
    if (v > INT64_MAX / mul) {
        return false;
    }
    out = neg ? -v * mul : v * mul;
    return true;
}

// codeDomain: per-key codes are the store's, except the ABI's own (-9000
// and below).
int32_t
codeDomain(mc_status_t code) {
    return code <= -9000 ? MC_DOMAIN_ABI : MC_DOMAIN_STORE;
}

nixl_status_t
toNixl(mc_status_t code) {
    if (code == MC_OK) {
        return NIXL_SUCCESS;
    }
    return code == MC_STORE_ERR_OBJECT_NOT_FOUND ? NIXL_ERR_NOT_FOUND : NIXL_ERR_BACKEND;
}

} // namespace

// A prepared transfer: one store key, DRAM buffer, length and object
// offset per descriptor pair; job is the posted run, result its outcome
// once checkXfer has seen it end.
struct nixlMooncakeStoreEngine::request : public nixlBackendReqH {
    nixl_xfer_op_t op;
    std::vector<std::string> keys;
    std::vector<const char *> key_ptrs;
    std::vector<void *> bufs;
    std::vector<uint64_t> lens;
    std::vector<uint64_t> offsets;
    std::future<nixl_status_t> job;
    std::optional<nixl_status_t> result;
};

std::string
nixlMooncakeStoreEngine::param(const std::string &key) const {
    const auto &p = getCustomParams();
    auto it = p.find(key);
    return it == p.end() ? std::string() : it->second;
}

nixlMooncakeStoreEngine::nixlMooncakeStoreEngine(const nixlBackendInitParams *init_params)
    : nixlBackendEngine(init_params) {
    std::string master = param("master_server_address");
    if (master.empty() && std::getenv("MOONCAKE_MASTER") != nullptr) {
        master = std::getenv("MOONCAKE_MASTER");
    }
    if (master.empty()) {
        NIXL_ERROR << "MOONCAKE_STORE: no master: set the backend parameter "
                      "master_server_address (host:port) or MOONCAKE_MASTER";
        initErr = true;
        return;
    }
    mc_store_config_t cfg;
    mc_store_config_init(&cfg);
    cfg.master = master.c_str();
    for (auto [name, field] : {std::pair{"global_segment_size", &cfg.segment_size},
                               std::pair{"local_buffer_size", &cfg.local_buffer_size}}) {
        std::string v = param(name);
        if (!v.empty() && !parseSize(v, *field)) {
            NIXL_ERROR << "MOONCAKE_STORE: " << name << "=\"" << v
                       << "\" is not a size (bytes, or a number with K/M/G/KiB/MiB/GiB)";
            initErr = true;
            return;
        }
    }
    std::string timeout = param("rpc_timeout_ms");
    if (!timeout.empty()) {
        if (timeout.size() > 18 || timeout.find_first_not_of("0123456789") != std::string::npos) {
            NIXL_ERROR << "MOONCAKE_STORE: rpc_timeout_ms=\"" << timeout
                       << "\" is not a number of milliseconds";
            initErr = true;
            return;
        }
        cfg.rpc_timeout_ms = std::stoull(timeout);
    }
    // checksum: CRC-32C of every object written (the store's default).
    // This backend's reads are ranged reads, which the store does not check
    // against the checksum of the whole object, so "false" costs NIXL's own
    // reads nothing and saves writes a pass over their bytes; only other
    // readers (whole-object gets) lose the check for these objects.
    std::string checksum = param("checksum");
    if (checksum == "false" || checksum == "0") {
        cfg.no_checksum = 1;
    } else if (!checksum.empty() && checksum != "true" && checksum != "1") {
        NIXL_ERROR << "MOONCAKE_STORE: checksum=\"" << checksum << "\" is not true or false";
        initErr = true;
        return;
    }
    mc_error_t err;
    if (mc_store_create(&cfg, &store_, &err) != MC_OK) {
        NIXL_ERROR << "MOONCAKE_STORE: connecting to the master at " << master << ": "
                   << mc_status_name(err.domain, err.code) << ": " << err.message;
        store_ = 0;
        initErr = true;
    }
}

nixlMooncakeStoreEngine::~nixlMooncakeStoreEngine() {
    if (store_ != 0) {
        mc_error_t err;
        if (mc_store_close(store_, &err) != MC_OK) {
            NIXL_WARN << "MOONCAKE_STORE: closing the store client: " << err.message;
        }
    }
}

nixl_status_t
nixlMooncakeStoreEngine::registerMem(const nixlBlobDesc &mem,
                                     const nixl_mem_t &nixl_mem,
                                     nixlBackendMD *&out) {
    if (nixl_mem == OBJ_SEG) {
        out = new storeMD(OBJ_SEG, 0, objectKey(mem));
        return NIXL_SUCCESS;
    }
    if (nixl_mem != DRAM_SEG) {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    std::lock_guard<std::mutex> lock(mu_);
    int &refs = dram_refs_[mem.addr];
    if (refs == 0) {
        mc_error_t err;
        if (mc_store_register_buffer(store_, reinterpret_cast<void *>(mem.addr), mem.len, &err) !=
            MC_OK) {
            dram_refs_.erase(mem.addr);
            NIXL_ERROR << "MOONCAKE_STORE: registering " << mem.len << " bytes at 0x" << std::hex
                       << mem.addr << std::dec << ": " << mc_status_name(err.domain, err.code)
                       << ": " << err.message;
            return NIXL_ERR_BACKEND;
        }
    }
    refs++;
    out = new storeMD(DRAM_SEG, mem.addr, "");
    return NIXL_SUCCESS;
}

nixl_status_t
nixlMooncakeStoreEngine::deregisterMem(nixlBackendMD *meta) {
    auto *md = static_cast<storeMD *>(meta);
    nixl_status_t st = NIXL_SUCCESS;
    if (md->type == DRAM_SEG) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = dram_refs_.find(md->addr);
        if (it != dram_refs_.end() && --it->second == 0) {
            dram_refs_.erase(it);
            mc_error_t err;
            if (mc_store_unregister_buffer(store_, reinterpret_cast<void *>(md->addr), &err) !=
                MC_OK) {
                NIXL_ERROR << "MOONCAKE_STORE: unregistering 0x" << std::hex << md->addr
                           << std::dec << ": " << err.message;
                st = NIXL_ERR_BACKEND;
            }
        }
    }
    delete md;
    return st;
}

nixl_status_t
nixlMooncakeStoreEngine::loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) {
    output = input;
    return NIXL_SUCCESS;
}

// unloadMD: what loadLocalMD handed out is the registration's own object,
// freed by deregisterMem.
nixl_status_t
nixlMooncakeStoreEngine::unloadMD(nixlBackendMD *) {
    return NIXL_SUCCESS;
}

nixl_status_t
nixlMooncakeStoreEngine::prepXfer(const nixl_xfer_op_t &operation,
                                  const nixl_meta_dlist_t &local,
                                  const nixl_meta_dlist_t &remote,
                                  const std::string &remote_agent,
                                  nixlBackendReqH *&handle,
                                  const nixl_opt_b_args_t *) const {
    if (operation != NIXL_READ && operation != NIXL_WRITE) {
        return NIXL_ERR_INVALID_PARAM;
    }
    if (remote_agent != localAgent) {
        NIXL_ERROR << "MOONCAKE_STORE: transfers are loopback only (the remote agent must be "
                   << localAgent << ", not " << remote_agent << ")";
        return NIXL_ERR_INVALID_PARAM;
    }
    if (local.getType() != DRAM_SEG || remote.getType() != OBJ_SEG) {
        NIXL_ERROR << "MOONCAKE_STORE: transfers go between DRAM (local) and OBJ (remote) "
                      "descriptors";
        return NIXL_ERR_INVALID_PARAM;
    }
    if (local.descCount() != remote.descCount()) {
        NIXL_ERROR << "MOONCAKE_STORE: " << local.descCount() << " DRAM descriptors but "
                   << remote.descCount() << " OBJ descriptors";
        return NIXL_ERR_INVALID_PARAM;
    }
    auto req = std::make_unique<request>();
    req->op = operation;
    const size_t n = local.descCount();
    for (size_t i = 0; i < n; i++) {
        const auto *md = static_cast<const storeMD *>(remote[i].metadataP);
        if (md == nullptr || md->type != OBJ_SEG) {
            return NIXL_ERR_INVALID_PARAM;
        }
        if (local[i].len != remote[i].len) {
            NIXL_ERROR << "MOONCAKE_STORE: descriptor " << i << ": " << local[i].len
                       << " DRAM bytes for " << remote[i].len << " object bytes";
            return NIXL_ERR_INVALID_PARAM;
        }
        // A store object is written whole (write-once values, replaced by
        // upsert); only reads may start inside one.
        if (operation == NIXL_WRITE && remote[i].addr != 0) {
            NIXL_ERROR << "MOONCAKE_STORE: descriptor " << i << " writes object " << md->key
                       << " at offset " << remote[i].addr << ": objects are written whole";
            return NIXL_ERR_NOT_SUPPORTED;
        }
        req->keys.push_back(md->key);
        req->bufs.push_back(reinterpret_cast<void *>(local[i].addr));
        req->lens.push_back(local[i].len);
        req->offsets.push_back(remote[i].addr);
    }
    for (const auto &k : req->keys) {
        req->key_ptrs.push_back(k.c_str());
    }
    handle = req.release();
    return NIXL_SUCCESS;
}

nixl_status_t
nixlMooncakeStoreEngine::postXfer(const nixl_xfer_op_t &,
                                  const nixl_meta_dlist_t &,
                                  const nixl_meta_dlist_t &,
                                  const std::string &,
                                  nixlBackendReqH *&handle,
                                  const nixl_opt_b_args_t *) const {
    auto *req = static_cast<request *>(handle);
    if (req->job.valid()) {
        return NIXL_ERR_REPOST_ACTIVE;
    }
    req->result.reset();
    if (req->keys.empty()) {
        return NIXL_SUCCESS;
    }
    // Store calls block: the batch runs on a thread of its own and
    // checkXfer polls it, so the agent's caller never waits on the store.
    req->job = std::async(std::launch::async, [this, req] { return run(*req); });
    return NIXL_IN_PROG;
}

// run moves one prepared transfer with one batch call to the store: a
// WRITE upserts every object from its buffer, a READ reads len bytes at the
// object offset of every descriptor. Failures are logged per key.
nixl_status_t
nixlMooncakeStoreEngine::run(request &req) const {
    const size_t n = req.keys.size();
    std::vector<mc_status_t> codes(n, MC_OK);
    mc_error_t err;
    mc_status_t rc;
    if (req.op == NIXL_WRITE) {
        std::vector<const void *> values(req.bufs.begin(), req.bufs.end());
        rc = mc_store_batch_upsert(store_, req.key_ptrs.data(), values.data(), req.lens.data(), n,
                                   nullptr, codes.data(), &err);
    } else {
        std::vector<size_t> ones(n, 1);
        rc = mc_store_batch_get_ranges(store_, req.key_ptrs.data(), req.bufs.data(),
                                       req.lens.data(), req.offsets.data(), ones.data(), n,
                                       nullptr, codes.data(), &err);
    }
    if (rc == MC_OK) {
        return NIXL_SUCCESS;
    }
    const char *what = req.op == NIXL_WRITE ? "writing" : "reading";
    nixl_status_t st = NIXL_SUCCESS;
    for (size_t i = 0; i < n; i++) {
        if (codes[i] == MC_OK) {
            continue;
        }
        NIXL_ERROR << "MOONCAKE_STORE: " << what << " object " << req.keys[i] << ": "
                   << mc_status_name(codeDomain(codes[i]), codes[i]);
        if (st == NIXL_SUCCESS) {
            st = toNixl(codes[i]);
        }
    }
    if (st == NIXL_SUCCESS) {
        // The call failed as a whole (no per-key code): say why.
        NIXL_ERROR << "MOONCAKE_STORE: " << what << " " << n << " objects: "
                   << mc_status_name(err.domain, err.code) << ": " << err.message;
        st = NIXL_ERR_BACKEND;
    } else {
        NIXL_ERROR << "MOONCAKE_STORE: " << err.message;
    }
    return st;
}

nixl_status_t
nixlMooncakeStoreEngine::checkXfer(nixlBackendReqH *handle) const {
    auto *req = static_cast<request *>(handle);
    if (req->result) {
        return *req->result;
    }
    if (!req->job.valid()) {
        return NIXL_SUCCESS; // posted with nothing to move
    }
    if (req->job.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        return NIXL_IN_PROG;
    }
    req->result = req->job.get();
    return *req->result;
}

nixl_status_t
nixlMooncakeStoreEngine::releaseReqH(nixlBackendReqH *handle) const {
    auto *req = static_cast<request *>(handle);
    // A store batch cannot be cancelled: wait for it, since it writes into
    // (or reads from) the caller's buffers.
    if (req->job.valid()) {
        req->job.wait();
    }
    delete req;
    return NIXL_SUCCESS;
}

nixl_status_t
nixlMooncakeStoreEngine::queryMem(const nixl_reg_dlist_t &descs,
                                  std::vector<nixl_query_resp_t> &resp) const {
    const size_t n = descs.descCount();
    std::vector<std::string> keys;
    std::vector<const char *> ptrs;
    for (size_t i = 0; i < n; i++) {
        keys.push_back(objectKey(descs[i]));
    }
    for (const auto &k : keys) {
        ptrs.push_back(k.c_str());
    }
    std::vector<int32_t> exists(n, 0);
    std::vector<mc_status_t> codes(n, MC_OK);
    mc_error_t err;
    resp.clear();
    if (n > 0 &&
        mc_store_batch_exist(store_, ptrs.data(), n, exists.data(), codes.data(), &err) != MC_OK) {
        NIXL_ERROR << "MOONCAKE_STORE: asking for " << n
                   << " objects: " << mc_status_name(err.domain, err.code) << ": " << err.message;
        return NIXL_ERR_BACKEND;
    }
    for (size_t i = 0; i < n; i++) {
        if (exists[i]) {
            resp.emplace_back(nixl_b_params_t{});
        } else {
            resp.emplace_back(std::nullopt);
        }
    }
    return NIXL_SUCCESS;
}
