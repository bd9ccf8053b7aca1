// mooncake.hpp's Transfer Engine across two processes: what TensorRT-LLM's
// transfer agent does (register memory, open the peer's segment, a batched
// write with a notification, status polling, reading back, notifications
// both ways, teardown), written on the C++ API; the peer runs Mooncake's C
// API (transfer_engine_c.h), so the two APIs meet on the wire. Then the
// failures: bad handles, bad requests, a closed peer.
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "suite.hpp"

namespace mctest {
namespace {

using namespace std::chrono_literals;

mooncake::EngineConfig config(const std::string &transport) {
    mooncake::EngineConfig c;
    c.host = "127.0.0.1";
    c.transport = transport == "tcp" ? "tcp" : "";
    c.timeout = 5s; // a dead peer fails a transfer in 5 s, not 30
    return c;
}

// Buffer is page-aligned memory of this process, zeroed.
struct Buffer {
    std::vector<std::byte> mem;
    explicit Buffer(std::size_t n) : mem(n) {}
    mooncake::bytes view() { return mooncake::as_writable_bytes(mem); }
    uint8_t *data() { return reinterpret_cast<uint8_t *>(mem.data()); }
};

// remote_pattern returns -1 when p[0, len) holds the bytes a peer filled
// at [off, off+len) with seed, else the index of the first wrong byte.
long long remote_pattern(const uint8_t *p, uint64_t len, uint64_t off, unsigned seed) {
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != pattern(off + i, seed)) return static_cast<long long>(i);
    return -1;
}

class EngineTest : public Suite, public testing::WithParamInterface<std::string> {};

TEST_P(EngineTest, TransferAgentSequence) {
    ForceTcp tcp(GetParam() == "tcp");
    Peer peer("te");
    mooncake::Engine engine(config(GetParam()));
    // registerMemory: the KV blocks of this side.
    Buffer local(1u << 20);
    auto mem = engine.register_memory(local.view());
    fill(local.data(), 0, local.mem.size(), 11);

    // loadRemoteAgent: open the peer's segment; it publishes its buffer.
    mooncake::Segment seg = engine.open_segment(peer.name());
    auto published = seg.buffers();
    ASSERT_EQ(published.size(), 1u);
    EXPECT_EQ(published[0].addr, peer.addr());
    EXPECT_EQ(published[0].length, peer.len());

    // submitTransferRequests with a sync message: scattered blocks written
    // to scattered places, one batch, the notification after it.
    const std::size_t blk = 64u << 10;
    std::vector<mooncake::Request> reqs;
    for (std::size_t i = 0; i < 4; i++) {
        auto src = mem.view().subspan((3 - i) * 2 * blk, blk); // reversed order, gaps between
        reqs.push_back(mooncake::write(src, seg, peer.addr() + i * 3 * blk));
    }
    mooncake::Batch batch = engine.allocate_batch(1024);
    batch.submit_with_notify(reqs, "ctx-agent", "Y3R4LTE=");
    // TransferStatus::isCompleted: poll every task, then wait for the batch.
    bool done = false;
    for (auto deadline = std::chrono::steady_clock::now() + 10s; !done && std::chrono::steady_clock::now() < deadline;) {
        done = true;
        for (std::size_t i = 0; i < reqs.size(); i++) {
            mooncake::TransferStatus s = batch.task(i);
            ASSERT_TRUE(s.state == mooncake::State::waiting || s.state == mooncake::State::pending || s.ok())
                << "task " << i << " state " << static_cast<int>(s.state);
            done = done && s.ok();
        }
    }
    ASSERT_TRUE(done);
    mooncake::TransferStatus sum = batch.wait();
    EXPECT_TRUE(sum.ok());
    EXPECT_EQ(sum.transferred, 4 * blk);
    batch.free();
    EXPECT_FALSE(batch);

    // Nothing but the blocks changed: the gaps keep the peer's pattern 0
    // (the blocks' bytes are checked by reading them back below).
    for (std::size_t i = 0; i < 4; i++) {
        std::string gap = "CHECK " + std::to_string(i * 3 * blk + blk) + " " + std::to_string(2 * blk) + " 0";
        EXPECT_EQ(peer.cmd(gap), "OK") << "gap after block " << i;
    }
    EXPECT_EQ(peer.cmd("WAITNOTIFY ctx-agent Y3R4LTE="), "OK");

    // Read the written blocks back into a second registered buffer and
    // compare them with their sources, byte for byte.
    Buffer back(4 * blk);
    auto back_mem = engine.register_memory(back.view());
    std::vector<mooncake::Request> reads;
    for (std::size_t i = 0; i < 4; i++)
        reads.push_back(mooncake::read(back_mem.view().subspan(i * blk, blk), seg, peer.addr() + i * 3 * blk));
    mooncake::Batch rb = engine.allocate_batch(8);
    rb.submit(reads);
    EXPECT_TRUE(rb.wait(10s).ok());
    for (std::size_t i = 0; i < 4; i++)
        EXPECT_EQ(std::memcmp(back.data() + i * blk, local.data() + (3 - i) * 2 * blk, blk), 0) << "block " << i;

    // A region the peer fills is read as the peer wrote it: the batch
    // takes more tasks after its first ones finished.
    ASSERT_EQ(peer.cmd("FILL 3145728 65536 23"), "OK");
    reads[0].remote_addr = peer.addr() + 3145728;
    rb.submit({reads.data(), 1});
    EXPECT_TRUE(rb.wait(10s).ok());
    EXPECT_TRUE(rb.task(4).ok());
    EXPECT_EQ(remote_pattern(back.data(), 65536, 3145728, 23), -1);

    // notifySyncMessage from the peer; getNotifiedSyncMessages here.
    EXPECT_EQ(peer.cmd("NOTIFY " + engine.name() + " gen-agent Z2VuLTE="), "OK");
    Notifications got;
    auto take = [&](Notifications &out) {
        for (auto &n : engine.notifies()) out.emplace_back(n.name, n.msg);
    };
    EXPECT_TRUE(wait_for(take, got, "gen-agent", "Z2VuLTE="));
    // and to the peer on its own (genNotifyInEngine's counterpart)
    seg.notify("ctx-agent", "c3luYw==");
    EXPECT_EQ(peer.cmd("WAITNOTIFY ctx-agent c3luYw=="), "OK");

    // Teardown in the agent's order, each step checked.
    rb.free();
    seg.close();
    back_mem.release();
    mem.release();
    engine.close();
    EXPECT_EQ(peer.quit(), 0);
}

// Every failure is an Error with the status, its domain and a message.
void expect_error(const std::function<void()> &f, mc_status_t status, int32_t domain) {
    try {
        f();
        ADD_FAILURE() << "no error, want " << mc_status_name(domain, status);
    } catch (const mooncake::Error &e) {
        EXPECT_EQ(e.status(), status) << e.what();
        EXPECT_EQ(e.domain(), domain) << e.what();
        EXPECT_STRNE(e.what(), "");
        EXPECT_STREQ(e.name(), mc_status_name(domain, status));
    }
}

TEST_F(Suite, AbiAndNames) {
    EXPECT_NO_THROW(mooncake::check_abi());
    mooncake::Error e(MC_TE_ERR_BATCH_BUSY, MC_DOMAIN_ENGINE, "busy");
    EXPECT_STREQ(e.name(), "BATCH_BUSY");
}

TEST_F(Suite, MovedFromOwnersThrow) {
    mooncake::Engine a(config("tcp"));
    mooncake::Engine b(std::move(a));
    EXPECT_FALSE(a);
    expect_error([&] { (void)a.name(); }, MC_ERR_INVALID_HANDLE, MC_DOMAIN_ABI);
    expect_error([&] { (void)a.allocate_batch(1); }, MC_ERR_INVALID_HANDLE, MC_DOMAIN_ABI);
    mooncake::Batch batch = b.allocate_batch(4);
    mooncake::Batch moved = std::move(batch);
    expect_error([&] { (void)batch.status(); }, MC_ERR_INVALID_HANDLE, MC_DOMAIN_ABI);
    EXPECT_EQ(moved.status().state, mooncake::State::waiting); // empty batch
    b.close();
    // Owners outliving their engine: their calls fail, their destructors
    // do no harm.
    expect_error([&] { (void)moved.status(); }, MC_ERR_INVALID_HANDLE, MC_DOMAIN_ABI);
}

TEST_F(Suite, BadRequests) {
    mooncake::Engine engine(config("tcp"));
    Buffer a(1u << 16), unreg(1u << 16);
    auto mem = engine.register_memory(a.view());
    // The same memory twice.
    expect_error([&] { (void)engine.register_memory(a.view().subspan(4096, 4096)); }, MC_TE_ERR_ADDRESS_OVERLAPPED,
                 MC_DOMAIN_ENGINE);
    mooncake::Segment self = engine.open_segment(engine.name());
    EXPECT_EQ(self.id(), MC_LOCAL_SEGMENT);
    mooncake::Batch batch = engine.allocate_batch(2);
    // Local memory that was never registered: refused at submit.
    mooncake::Request r = mooncake::write(unreg.view(), self, mem.address());
    expect_error([&] { batch.submit({&r, 1}); }, MC_TE_ERR_ADDRESS_NOT_REGISTERED, MC_DOMAIN_ENGINE);
    // More tasks than the batch holds.
    std::vector<mooncake::Request> three(3, mooncake::write(mem.view().subspan(0, 16), self, mem.address() + 4096));
    expect_error([&] { batch.submit(three); }, MC_TE_ERR_TOO_MANY_REQUESTS, MC_DOMAIN_ENGINE);
    // A segment that does not exist.
    expect_error([&] { (void)engine.open_segment("127.0.0.1:1"); }, MC_TE_ERR_SOCKET, MC_DOMAIN_ENGINE);
    // A task that does not exist.
    expect_error([&] { (void)batch.task(7); }, MC_TE_ERR_INVALID_ARGUMENT, MC_DOMAIN_ENGINE);
    // Views never reach past their buffer.
    EXPECT_THROW((void)mem.view().subspan(a.mem.size(), 1), std::out_of_range);
}

TEST_P(EngineTest, PeerFailures) {
    ForceTcp tcp(GetParam() == "tcp");
    Peer peer("te");
    mooncake::Engine engine(config(GetParam()));
    Buffer local(1u << 16);
    fill(local.data(), 0, local.mem.size(), 5);
    auto mem = engine.register_memory(local.view());
    mooncake::Segment seg = engine.open_segment(peer.name());

    // Past the end of the peer's registered buffer: the task fails, the
    // peer's bytes stay as they were, no notification is sent.
    {
        mooncake::Batch b = engine.allocate_batch(1);
        mooncake::Request r = mooncake::write(mem.view(), seg, peer.addr() + peer.len() - 4096);
        b.submit_with_notify({&r, 1}, "ctx-agent", "bm90LXNlbnQ=");
        try {
            (void)b.wait(10s);
            ADD_FAILURE() << "a write past the peer's buffer completed";
        } catch (const mooncake::Error &e) {
            EXPECT_EQ(e.domain(), MC_DOMAIN_ENGINE) << e.what();
            EXPECT_NE(std::string(e.what()).find("rejected"), std::string::npos) << e.what();
        }
        mooncake::TransferStatus t = b.task(0);
        EXPECT_EQ(t.state, mooncake::State::failed);
        EXPECT_NE(t.error, MC_OK);
        EXPECT_EQ(peer.cmd("CHECK " + std::to_string(peer.len() - 4096) + " 4096 0"), "OK");
    }
    // A closed segment's id is no longer usable.
    mc_segment_t old = seg.id();
    seg.close();
    {
        mooncake::Batch b = engine.allocate_batch(1);
        mooncake::Request r{MC_OP_WRITE, 0, local.data(), old, peer.addr(), 4096};
        expect_error([&] { b.submit({&r, 1}); }, MC_TE_ERR_INVALID_ARGUMENT, MC_DOMAIN_ENGINE);
    }
    // A peer that went away: the transfer fails within the deadline, and
    // opening it again fails.
    seg = engine.open_segment(peer.name());
    std::string name = peer.name();
    ASSERT_EQ(peer.quit(), 0);
    {
        mooncake::Batch b = engine.allocate_batch(1);
        mooncake::Request r = mooncake::write(mem.view(), seg, peer.addr());
        try {
            b.submit({&r, 1});
            (void)b.wait(20s);
            ADD_FAILURE() << "a write to a closed peer completed";
        } catch (const mooncake::Error &e) {
            EXPECT_NE(e.status(), MC_ERR_TIMED_OUT) << e.what();
        }
        EXPECT_NE(b.status().state, mooncake::State::completed);
    }
    seg.close();
    EXPECT_THROW((void)engine.open_segment(name), mooncake::Error);
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineTest, testing::ValuesIn(transports()));

} // namespace
} // namespace mctest
