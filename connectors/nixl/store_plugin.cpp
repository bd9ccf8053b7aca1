// store_plugin.cpp: the entry points NIXL's plugin loader looks up in
// libplugin_MOONCAKE_STORE.so (backends=["MOONCAKE_STORE"]).
#include "backend/backend_plugin.h"
#include "store_backend.h"

namespace {

// The parameters an agent may pass to create_backend, with their defaults
// (empty: see store_backend.h).
nixl_b_params_t
storeOptions() {
    return {{"master_server_address", ""}, {"global_segment_size", ""}, {"local_buffer_size", ""},
            {"rpc_timeout_ms", ""}};
}

} // namespace

extern "C" NIXL_PLUGIN_EXPORT nixlBackendPlugin *
nixl_plugin_init() {
    return nixlBackendPluginCreator<nixlMooncakeStoreEngine>::create(
        NIXL_PLUGIN_API_VERSION, "MOONCAKE_STORE", "0.1.0", storeOptions(), {DRAM_SEG, OBJ_SEG});
}

extern "C" NIXL_PLUGIN_EXPORT void
nixl_plugin_fini() {}
