// A C++ consumer built the way NIXL's plugin and TensorRT-LLM's agent are:
// it includes Mooncake's header and links libtransfer_engine.so by name.
// It also checks that mooncake.h compiles as C++, and that loading
// libmooncake.so by path as well (as the Python package does) gives the same
// library: one Go runtime, one handle table.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "mooncake.h"
#include "transfer_engine_c.h"

int main(int argc, char **argv) {
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, true);
    if (te == nullptr) return 1;
    if (argc > 1) {
        void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) return 11;
        using live_fn = mc_status_t (*)(uint64_t *, uint64_t *, mc_error_t *);
        auto live = reinterpret_cast<live_fn>(dlsym(lib, "mc_debug_live_handles"));
        uint64_t engines = 0, stores = 0;
        if (live == nullptr || live(&engines, &stores, nullptr) != MC_OK) return 12;
        if (engines != 1) return 13; // a second copy would count none
    }
    char name[128];
    if (getLocalIpAndPort(te, name, sizeof name) != 0 || std::strncmp(name, "127.0.0.1:", 10) != 0) return 2;
    std::vector<char> a(1 << 16, 'x'), b(1 << 16, 'y');
    if (registerLocalMemory(te, a.data(), a.size(), "*", 1) != 0) return 3;
    if (registerLocalMemory(te, b.data(), b.size(), "*", 1) != 0) return 4;
    segment_id_t seg = openSegment(te, name);
    batch_id_t batch = allocateBatchID(te, 1024);
    transfer_request_t req{};
    req.opcode = OPCODE_WRITE;
    req.source = a.data();
    req.target_id = seg;
    req.target_offset = reinterpret_cast<uint64_t>(b.data());
    req.length = a.size();
    if (submitTransfer(te, batch, &req, 1) != 0) return 5;
    transfer_status_t st{};
    for (int i = 0; i < 1000000 && st.status != STATUS_COMPLETED; i++) {
        if (getTransferStatus(te, batch, 0, &st) != 0) return 6;
        if (st.status == STATUS_FAILED) return 7;
    }
    if (st.status != STATUS_COMPLETED || a != b) return 8;
    if (freeBatchID(te, batch) != 0) return 9;
    unregisterLocalMemory(te, a.data());
    unregisterLocalMemory(te, b.data());
    destroyTransferEngine(te);
    if ((mc_abi_version() >> 16) != MC_ABI_VERSION_MAJOR) return 10;
    std::printf("ok   cxx_link (libtransfer_engine.so, %s)\n", name);
    return 0;
}
