// TensorRT-LLM's Mooncake transfer agent, replayed on Mooncake's C API
// (transfer_engine_c.h, linked as libtransfer_engine.so) in its order, with
// the 14 functions it calls; the peer runs mooncake.hpp. Then the bad input
// the agent could hand the library: null, destroyed and made-up handles,
// unknown batches, a closed peer.
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "suite.hpp"
#include "transfer_engine_c.h"

namespace mctest {
namespace {

using namespace std::chrono_literals;

// poll_tasks is TransferStatus::wait: getTransferStatus per task until all
// are final; WAITING and PENDING are in progress, COMPLETED done, anything
// else a failure. Returns the last states.
std::vector<int> poll_tasks(transfer_engine_t te, batch_id_t b, std::size_t n) {
    std::vector<int> states(n, STATUS_WAITING);
    for (auto deadline = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < deadline;) {
        bool running = false;
        for (std::size_t i = 0; i < n; i++) {
            transfer_status_t s{-1, 0};
            if (getTransferStatus(te, b, i, &s) != 0) {
                states[i] = -1;
                continue;
            }
            states[i] = s.status;
            running = running || s.status == STATUS_WAITING || s.status == STATUS_PENDING;
        }
        if (!running) break;
    }
    return states;
}

// TakeNotifs is getNotifiedSyncMessages: getNotifsFromEngine, copy,
// freeNotifsMsgBuf.
void take_notifs(transfer_engine_t te, Notifications &out) {
    int n = 0;
    notify_msg_t *ns = getNotifsFromEngine(te, &n);
    for (int i = 0; i < n; i++) out.emplace_back(ns[i].name, ns[i].msg);
    freeNotifsMsgBuf(ns, n);
}

class AgentTest : public Suite, public testing::WithParamInterface<std::string> {};

TEST_P(AgentTest, MooncakeAgentSequence) {
    ForceTcp tcp(GetParam() == "tcp");
    Peer peer("hpp");
    // MooncakeTransferAgent(config): the engine, and its identity.
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    ASSERT_NE(te, nullptr);
    char self[128];
    ASSERT_EQ(getLocalIpAndPort(te, self, sizeof self), 0);
    EXPECT_EQ(std::strncmp(self, "127.0.0.1:", 10), 0) << self;

    // registerMemory(descs): the agent registers each region "*", remote
    // accessible.
    std::vector<uint8_t> kv(2u << 20), scratch(1u << 20);
    fill(kv.data(), 0, kv.size(), 31);
    ASSERT_EQ(registerLocalMemory(te, kv.data(), kv.size(), "*", 1), 0);
    ASSERT_EQ(registerLocalMemory(te, scratch.data(), scratch.size(), "*", 1), 0);

    // loadRemoteAgent(name, connection info "ip:port").
    segment_id_t seg = openSegment(te, peer.name().c_str());
    ASSERT_GE(seg, 0);

    // submitTransferRequests(WRITE, sync message): one batch of 1024, one
    // request per block, the base64 message sent once all completed.
    batch_id_t b = allocateBatchID(te, 1024);
    ASSERT_NE(b, INVALID_BATCH);
    const uint64_t blk = 256u << 10;
    std::vector<transfer_request_t> reqs;
    for (uint64_t i = 0; i < 3; i++) {
        transfer_request_t r{};
        r.opcode = OPCODE_WRITE;
        r.source = kv.data() + i * 2 * blk;
        r.target_id = seg;
        r.target_offset = peer.addr() + (2 - i) * blk; // reversed, packed
        r.length = blk;
        reqs.push_back(r);
    }
    std::string name = "trtllm-ctx-0", msg = "Y3R4LTQy"; // base64("ctx-42")
    ASSERT_EQ(submitTransferWithNotify(te, b, reqs.data(), reqs.size(), notify_msg_t{name.data(), msg.data()}), 0);
    for (int st : poll_tasks(te, b, reqs.size())) EXPECT_EQ(st, STATUS_COMPLETED);
    transfer_status_t s{};
    ASSERT_EQ(getTransferStatus(te, b, 2, &s), 0);
    EXPECT_EQ(s.transferred_bytes, blk);
    EXPECT_EQ(freeBatchID(te, b), 0);
    EXPECT_EQ(peer.cmd("WAITNOTIFY trtllm-ctx-0 Y3R4LTQy"), "OK");
    EXPECT_EQ(peer.cmd("CHECK " + std::to_string(3 * blk) + " 65536 0"), "OK"); // past the blocks

    // submitTransferRequests(READ), no sync message: the blocks back into
    // scratch, compared byte for byte with their sources.
    b = allocateBatchID(te, 1024);
    ASSERT_NE(b, INVALID_BATCH);
    transfer_request_t rd{};
    rd.opcode = OPCODE_READ;
    rd.source = scratch.data();
    rd.target_id = seg;
    rd.target_offset = peer.addr();
    rd.length = 3 * blk;
    ASSERT_EQ(submitTransfer(te, b, &rd, 1), 0);
    EXPECT_EQ(poll_tasks(te, b, 1)[0], STATUS_COMPLETED);
    EXPECT_EQ(freeBatchID(te, b), 0);
    for (uint64_t i = 0; i < 3; i++)
        EXPECT_EQ(std::memcmp(scratch.data() + (2 - i) * blk, kv.data() + i * 2 * blk, blk), 0) << "block " << i;

    // notifySyncMessage(name, message): genNotifyInEngine to the segment.
    std::string sync = "c3luYw==";
    ASSERT_EQ(genNotifyInEngine(te, static_cast<uint64_t>(seg), notify_msg_t{name.data(), sync.data()}), 0);
    EXPECT_EQ(peer.cmd("WAITNOTIFY trtllm-ctx-0 c3luYw=="), "OK");

    // getNotifiedSyncMessages: what the generation side sent.
    ASSERT_EQ(peer.cmd(std::string("NOTIFY ") + self + " trtllm-gen-0 Z2VuLWRvbmU="), "OK");
    Notifications got;
    EXPECT_TRUE(wait_for([&](Notifications &out) { take_notifs(te, out); }, got, "trtllm-gen-0", "Z2VuLWRvbmU="));

    // deregisterMemory, ~MooncakeTransferAgent.
    EXPECT_EQ(unregisterLocalMemory(te, kv.data()), 0);
    EXPECT_EQ(unregisterLocalMemory(te, scratch.data()), 0);
    destroyTransferEngine(te);
    EXPECT_EQ(peer.quit(), 0);
}

TEST_P(AgentTest, FailuresAreReturnedNotCrashes) {
    ForceTcp tcp(GetParam() == "tcp");
    Peer peer("hpp");
    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
    ASSERT_NE(te, nullptr);
    std::vector<uint8_t> kv(1u << 20);
    ASSERT_EQ(registerLocalMemory(te, kv.data(), kv.size(), "*", 1), 0);
    // Overlapping registration, unregistering what was never registered.
    EXPECT_EQ(registerLocalMemory(te, kv.data() + 4096, 4096, "*", 1), -7);
    int stack = 0;
    EXPECT_LT(unregisterLocalMemory(te, &stack), 0);
    segment_id_t seg = openSegment(te, peer.name().c_str());
    ASSERT_GE(seg, 0);

    // Unknown batches and tasks.
    transfer_status_t s{};
    EXPECT_LT(getTransferStatus(te, 12345, 0, &s), 0);
    EXPECT_LT(freeBatchID(te, 12345), 0);
    transfer_request_t r{};
    r.opcode = OPCODE_WRITE;
    r.source = kv.data();
    r.target_id = seg;
    r.target_offset = peer.addr();
    r.length = 4096;
    EXPECT_LT(submitTransfer(te, INVALID_BATCH, &r, 1), 0);
    batch_id_t b = allocateBatchID(te, 4);
    ASSERT_NE(b, INVALID_BATCH);
    EXPECT_LT(getTransferStatus(te, b, 9, &s), 0);
    // A segment id never opened.
    transfer_request_t unknown = r;
    unknown.target_id = seg + 1000;
    EXPECT_LT(submitTransfer(te, b, &unknown, 1), 0);
    // Outside the peer's buffer: the task fails (the agent's kFAILURE), the
    // notification is not sent, the peer's bytes are untouched.
    transfer_request_t outside = r;
    outside.target_offset = peer.addr() + peer.len();
    std::string name = "trtllm-ctx-0", msg = "bm90LXNlbnQ=";
    ASSERT_EQ(submitTransferWithNotify(te, b, &outside, 1, notify_msg_t{name.data(), msg.data()}), 0);
    EXPECT_EQ(poll_tasks(te, b, 1)[0], STATUS_FAILED);
    EXPECT_EQ(freeBatchID(te, b), 0);
    EXPECT_EQ(peer.cmd("CHECK 0 " + std::to_string(peer.len()) + " 0"), "OK");

    // A closed peer: a transfer to it fails (in the engine's deadline),
    // opening it again fails.
    std::string gone = peer.name();
    ASSERT_EQ(peer.quit(), 0);
    b = allocateBatchID(te, 4);
    ASSERT_NE(b, INVALID_BATCH);
    if (submitTransfer(te, b, &r, 1) == 0) {
        EXPECT_EQ(poll_tasks(te, b, 1)[0], STATUS_FAILED);
    }
    EXPECT_EQ(freeBatchID(te, b), 0);
    EXPECT_LT(openSegmentNoCache(te, gone.c_str()), 0);
    EXPECT_EQ(unregisterLocalMemory(te, kv.data()), 0);
    destroyTransferEngine(te);

    // Null, destroyed and made-up engines: failure values, no crash.
    int x = 0;
    char buf[64];
    for (transfer_engine_t bad : {static_cast<transfer_engine_t>(nullptr), te, static_cast<transfer_engine_t>(&x)}) {
        EXPECT_EQ(getLocalIpAndPort(bad, buf, sizeof buf), -1);
        EXPECT_LT(openSegment(bad, gone.c_str()), 0);
        EXPECT_EQ(registerLocalMemory(bad, kv.data(), kv.size(), "*", 1), -1);
        EXPECT_EQ(allocateBatchID(bad, 4), INVALID_BATCH);
        EXPECT_EQ(submitTransfer(bad, 1, &r, 1), -1);
        EXPECT_EQ(getTransferStatus(bad, 1, 0, &s), -1);
        EXPECT_EQ(freeBatchID(bad, 1), -1);
        EXPECT_EQ(genNotifyInEngine(bad, 0, notify_msg_t{name.data(), msg.data()}), -1);
        int n = 7;
        notify_msg_t *ns = getNotifsFromEngine(bad, &n);
        EXPECT_EQ(ns, nullptr);
        EXPECT_EQ(unregisterLocalMemory(bad, kv.data()), -1);
        destroyTransferEngine(bad); // a no-op
    }
    EXPECT_EQ(createTransferEngine("nonsense://", "127.0.0.1", "", 0, 1), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Transports, AgentTest, testing::ValuesIn(transports()));

} // namespace
} // namespace mctest
