// mooncake.hpp's Store against a real store (MC_TEST_MASTER, which
// scripts/test-trtllm.sh starts with `mooncake up`): registered buffers,
// single and batch puts and gets checked byte for byte, per-key failures
// in batches, errors with the Store's codes.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "suite.hpp"

namespace mctest {
namespace {

class StoreTest : public Suite {
protected:
    void SetUp() override {
        const char *m = std::getenv("MC_TEST_MASTER");
        if (m == nullptr || *m == '\0') GTEST_SKIP() << "MC_TEST_MASTER not set (scripts/test-trtllm.sh sets it)";
        master = m;
    }
    mooncake::StoreConfig config() const {
        mooncake::StoreConfig c;
        c.master = master;
        c.local_hostname = "127.0.0.1";
        c.segment_size = 16 << 20;
        c.local_buffer_size = 16 << 20;
        return c;
    }
    std::string master;
};

TEST_F(StoreTest, PutGetBatchesAndErrors) {
    mooncake::Store store(config());
    EXPECT_FALSE(store.name().empty());
    const std::string pfx = "trtllm-hpp-" + std::to_string(getpid()) + "-";

    // Any memory, through the staging buffer.
    std::vector<uint8_t> v(100000);
    fill(v.data(), 0, v.size(), 3);
    store.put(pfx + "a", mooncake::as_bytes(v));
    EXPECT_TRUE(store.exists(pfx + "a"));
    EXPECT_EQ(store.size(pfx + "a"), v.size());
    std::vector<std::byte> got = store.get(pfx + "a");
    ASSERT_EQ(got.size(), v.size());
    EXPECT_EQ(check(got.data(), 0, got.size(), 3), -1);

    // Registered memory, moved straight from and into it, in batches.
    std::vector<std::byte> reg(1u << 20);
    mooncake::StoreBuffer buf = store.register_buffer(mooncake::as_writable_bytes(reg));
    mooncake::bytes all = buf.view();
    fill(all.data(), 0, 3 * 65536, 4);
    std::vector<std::string> keys = {pfx + "b0", pfx + "b1", pfx + "b2"};
    std::vector<mooncake::const_bytes> values;
    for (std::size_t i = 0; i < 3; i++) values.push_back(all.subspan(i * 65536, 65536));
    for (mc_status_t st : store.batch_put_from(keys, values)) EXPECT_EQ(st, MC_OK);
    auto exist = store.batch_exists(std::vector<std::string>{keys[0], pfx + "missing", keys[2]});
    EXPECT_EQ(exist, (std::vector<bool>{true, false, true}));

    // Read them back into the second half, plus a missing key: per-key
    // codes, no exception.
    std::vector<std::string> rkeys = {keys[2], pfx + "missing", keys[0]};
    std::vector<mooncake::bytes> into = {all.subspan(512 << 10, 65536), all.subspan(640 << 10, 65536),
                                         all.subspan(768 << 10, 65536)};
    std::vector<uint64_t> lens;
    auto codes = store.batch_get_into(rkeys, into, &lens);
    EXPECT_EQ(codes, (std::vector<mc_status_t>{MC_OK, MC_STORE_ERR_OBJECT_NOT_FOUND, MC_OK}));
    EXPECT_EQ(lens, (std::vector<uint64_t>{65536, 0, 65536}));
    EXPECT_EQ(std::memcmp(into[0].data(), all.data() + 2 * 65536, 65536), 0);
    EXPECT_EQ(std::memcmp(into[2].data(), all.data(), 65536), 0);
    EXPECT_EQ(store.get_into(keys[1], all.subspan(900 << 10, 65536)), 65536u);
    EXPECT_EQ(std::memcmp(all.data() + (900 << 10), all.data() + 65536, 65536), 0);

    // Errors carry the Store's codes.
    try {
        (void)store.get(pfx + "missing");
        ADD_FAILURE() << "got a missing key";
    } catch (const mooncake::Error &e) {
        EXPECT_EQ(e.status(), MC_STORE_ERR_OBJECT_NOT_FOUND);
        EXPECT_EQ(e.domain(), MC_DOMAIN_STORE);
    }
    std::vector<std::byte> small(10);
    try {
        (void)store.get_into(pfx + "a", mooncake::as_writable_bytes(small));
        ADD_FAILURE() << "a value larger than the buffer was read";
    } catch (const mooncake::Error &e) {
        EXPECT_EQ(e.status(), MC_STORE_ERR_INVALID_PARAMS) << e.what();
    }
    EXPECT_THROW(store.batch_put_from(keys, std::vector<mooncake::const_bytes>(2)), mooncake::Error);

    store.upsert(pfx + "a", mooncake::as_bytes(std::string("new")));
    EXPECT_EQ(store.size(pfx + "a"), 3u);
    for (auto &k : keys) store.remove(k, true);
    store.remove(pfx + "a", true);
    EXPECT_FALSE(store.exists(keys[0]));
    buf = mooncake::StoreBuffer();
    store.close();
    // Moved-from and closed: the ABI's handle error.
    try {
        (void)store.exists(pfx + "a");
        ADD_FAILURE() << "a closed store answered";
    } catch (const mooncake::Error &e) {
        EXPECT_EQ(e.status(), MC_ERR_INVALID_HANDLE);
    }
}

} // namespace
} // namespace mctest
