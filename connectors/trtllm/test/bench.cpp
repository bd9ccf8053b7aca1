// bench: the cost of mooncake.hpp over the C ABIs it stands beside. Two
// engines of this process (one the initiator, one holding the target
// buffer) move a batch of `count` writes of `size` bytes, submitted and
// waited for through
//
//   hpp   mooncake::Batch (submit, wait)
//   c     mooncake.h (mc_engine_allocate_batch, submit, wait, free)
//   te    transfer_engine_c.h as TensorRT-LLM's agent calls it
//         (allocateBatchID, submitTransfer, getTransferStatus polling,
//         freeBatchID)
//
// against the yardstick memcpy of the same bytes, in the same run. Each
// figure is the median of `repeats` runs of `iters` batches, the methods
// taking turns; hpp/c is the median of the per-round ratios.
//
//   mooncake_cxx_bench [transport auto|tcp] [size] [count] [iters] [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "mooncake.hpp"
#include "transfer_engine_c.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Method is one way of moving a batch; rates collects its runs.
struct Method {
    const char *name;
    std::function<void()> batch;
    std::vector<double> rates;
};

// run times iters batches of each method, round robin, repeats times (so
// the machine's noise falls on all alike), and stores the rates in batches
// per second.
void run(int iters, int repeats, std::vector<Method> &methods) {
    for (auto &m : methods) m.batch(); // warm: connections, first touch
    for (int r = 0; r < repeats; r++)
        for (auto &m : methods) {
            auto t0 = Clock::now();
            for (int i = 0; i < iters; i++) m.batch();
            m.rates.push_back(iters / std::chrono::duration<double>(Clock::now() - t0).count());
        }
}

} // namespace

int main(int argc, char **argv) {
    std::string transport = argc > 1 ? argv[1] : "auto";
    std::size_t size = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : (1u << 20);
    std::size_t count = argc > 3 ? std::strtoull(argv[3], nullptr, 0) : 64;
    int iters = argc > 4 ? std::atoi(argv[4]) : 20;
    int repeats = argc > 5 ? std::atoi(argv[5]) : 5;
    if (transport == "tcp") setenv("MC_FORCE_TCP", "1", 1);

    mooncake::EngineConfig cfg;
    cfg.host = "127.0.0.1";
    cfg.transport = transport == "tcp" ? "tcp" : "";
    mooncake::Engine target(cfg), init(cfg);
    std::vector<std::byte> src(size * count), dst(size * count);
    std::memset(src.data(), 7, src.size());
    auto dst_mem = target.register_memory(mooncake::as_writable_bytes(dst));
    auto src_mem = init.register_memory(mooncake::as_writable_bytes(src));
    mooncake::Segment seg = init.open_segment(target.name());
    std::vector<mooncake::Request> reqs;
    for (std::size_t i = 0; i < count; i++)
        reqs.push_back(mooncake::write(src_mem.view().subspan(i * size, size), seg, dst_mem.address() + i * size));

    std::vector<Method> methods;
    methods.push_back({"hpp", [&] {
        mooncake::Batch b = init.allocate_batch(static_cast<uint32_t>(count));
        b.submit(reqs);
        b.wait();
    }, {}});

    methods.push_back({"c", [&] {
        mc_batch_t b = 0;
        if (mc_engine_allocate_batch(init.handle(), static_cast<uint32_t>(count), &b, nullptr) != MC_OK ||
            mc_engine_submit(init.handle(), b, reqs.data(), reqs.size(), nullptr) != MC_OK ||
            mc_engine_wait(init.handle(), b, -1, nullptr, nullptr) != MC_OK ||
            mc_engine_free_batch(init.handle(), b, nullptr) != MC_OK)
            std::abort();
    }, {}});

    // Mooncake's C API, on an engine of its own (the TensorRT-LLM agent's).
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    if (te == nullptr || registerLocalMemory(te, src.data(), src.size(), "*", 1) != 0) return 1;
    segment_id_t tseg = openSegment(te, target.name().c_str());
    std::vector<transfer_request_t> treqs(count);
    for (std::size_t i = 0; i < count; i++) {
        treqs[i] = transfer_request_t{};
        treqs[i].opcode = OPCODE_WRITE;
        treqs[i].source = src.data() + i * size;
        treqs[i].target_id = tseg;
        treqs[i].target_offset = dst_mem.address() + i * size;
        treqs[i].length = size;
    }
    methods.push_back({"te", [&] {
        batch_id_t b = allocateBatchID(te, 1024);
        if (submitTransfer(te, b, treqs.data(), treqs.size()) != 0) std::abort();
        for (std::size_t i = 0; i < count; i++) {
            transfer_status_t s{};
            do {
                if (getTransferStatus(te, b, i, &s) != 0) std::abort();
            } while (s.status == STATUS_WAITING || s.status == STATUS_PENDING);
            if (s.status != STATUS_COMPLETED) std::abort();
        }
        freeBatchID(te, b);
    }, {}});
    methods.push_back({"memcpy", [&] { std::memcpy(dst.data(), src.data(), src.size()); }, {}});
    run(iters, repeats, methods);
    unregisterLocalMemory(te, src.data());
    destroyTransferEngine(te);

    double bytes = static_cast<double>(size * count);
    std::printf("transport=%s size=%zu count=%zu iters=%d repeats=%d (medians)\n", transport.c_str(), size, count,
                iters, repeats);
    double mem = median(methods[3].rates);
    for (auto &m : methods) {
        double rate = median(m.rates);
        std::printf("  %-6s %9.1f batches/s %8.2f GB/s  %5.2fx memcpy\n", m.name, rate, rate * bytes / 1e9,
                    rate / mem);
    }
    std::vector<double> ratio;
    for (int r = 0; r < repeats; r++) ratio.push_back(methods[0].rates[r] / methods[1].rates[r]);
    std::printf("  hpp/c = %.3f\n", median(ratio));
    return 0;
}
