// Linked as TensorRT-LLM links libtensorrt_llm_mooncake_wrapper.so (the
// file find_library found under MOONCAKE_ROOT): it must record the
// library's SONAME, not that path, and run from wherever the loader finds
// the library. One loopback write through the engine checks it works.
#include <cstdio>
#include <cstring>
#include <vector>

#include "transfer_engine_c.h"

int main() {
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, true);
    if (te == nullptr) return 1;
    char name[128];
    if (getLocalIpAndPort(te, name, sizeof name) != 0) return 2;
    std::vector<char> a(1 << 16, 'a'), b(1 << 16, 'b');
    if (registerLocalMemory(te, a.data(), a.size(), "*", 1) != 0) return 3;
    if (registerLocalMemory(te, b.data(), b.size(), "*", 1) != 0) return 4;
    segment_id_t seg = openSegment(te, name);
    if (seg < 0) return 5;
    batch_id_t batch = allocateBatchID(te, 1024);
    transfer_request_t req{};
    req.opcode = OPCODE_WRITE;
    req.source = a.data();
    req.target_id = seg;
    req.target_offset = reinterpret_cast<uint64_t>(b.data());
    req.length = a.size();
    if (submitTransfer(te, batch, &req, 1) != 0) return 6;
    transfer_status_t st{};
    do {
        if (getTransferStatus(te, batch, 0, &st) != 0) return 7;
    } while (st.status == STATUS_WAITING || st.status == STATUS_PENDING);
    if (st.status != STATUS_COMPLETED || a != b) return 8;
    freeBatchID(te, batch);
    unregisterLocalMemory(te, a.data());
    unregisterLocalMemory(te, b.data());
    destroyTransferEngine(te);
    std::puts("trtllm_style_link: ok");
    return 0;
}
