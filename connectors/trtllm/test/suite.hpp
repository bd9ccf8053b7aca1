// Shared by the tests: the fixture that checks for leaked handles, and
// waiting for a notification on this side.
#ifndef MOONCAKE_TRTLLM_TEST_SUITE_HPP
#define MOONCAKE_TRTLLM_TEST_SUITE_HPP

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mooncake.hpp"
#include "peer.hpp"

namespace mctest {

// Suite fails a test that leaves engine or store handles alive: every
// owner of mooncake.hpp, and each test's own teardown, frees what it took.
class Suite : public testing::Test {
protected:
    void TearDown() override {
        uint64_t engines = 0, stores = 0;
        ASSERT_EQ(mc_debug_live_handles(&engines, &stores, nullptr), MC_OK);
        EXPECT_EQ(engines, 0u) << "engine handles left alive";
        EXPECT_EQ(stores, 0u) << "store handles left alive";
    }
};

using Notifications = std::vector<std::pair<std::string, std::string>>;

// wait_for polls take (which appends what arrived to got) until got holds
// (name, msg) or 10 s pass: notifications have no blocking call, and
// TensorRT-LLM's agent polls them too.
inline bool wait_for(const std::function<void(Notifications &)> &take, Notifications &got, const std::string &name,
                     const std::string &msg) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
        take(got);
        for (auto &n : got)
            if (n.first == name && n.second == msg) return true;
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

// Transports the two-process tests run on: the default (shared memory
// between processes of one host) and TCP (MC_FORCE_TCP=1, as TensorRT-LLM's
// CI runs Mooncake).
inline std::vector<std::string> transports() { return {"auto", "tcp"}; }

// ForceTcp sets MC_FORCE_TCP for the engines this process and its peers
// start while it lives.
class ForceTcp {
public:
    explicit ForceTcp(bool on) {
        if (on) setenv("MC_FORCE_TCP", "1", 1);
        else unsetenv("MC_FORCE_TCP");
    }
    ~ForceTcp() { unsetenv("MC_FORCE_TCP"); }
};

} // namespace mctest

#endif
