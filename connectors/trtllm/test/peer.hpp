// The remote side of the two-process tests: the test binary run again as
// "--peer MODE" (a fresh exec: a process with a Go runtime cannot fork a
// working copy of itself). The peer starts an engine, registers a buffer
// filled with pattern 0, prints "READY <segment> <addr hex> <len>" and
// answers one command per line:
//
//   FILL off len seed        fill [off, off+len) of its buffer -> OK
//   CHECK off len seed       check it -> OK | BAD <offset of the first wrong byte>
//   WAITNOTIFY name msg      wait (up to 10 s) for that notification -> OK | NONE
//   NOTIFY segment name msg  open segment, send it (name, msg) -> OK | ERR <code>
//   QUIT                     tear down, exit 0 when all went well
//
// MODE is "hpp" (mooncake::Engine over mooncake.h) or "te" (Mooncake's
// transfer_engine_c.h, as TensorRT-LLM's agent calls it); MC_FORCE_TCP in
// the environment keeps both on TCP.
#ifndef MOONCAKE_TRTLLM_TEST_PEER_HPP
#define MOONCAKE_TRTLLM_TEST_PEER_HPP

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mctest {

constexpr std::size_t kPeerLen = 4u << 20;

// pattern is the byte at offset i of a buffer filled with seed.
inline uint8_t pattern(uint64_t i, unsigned seed) {
    return static_cast<uint8_t>((i * 131u + seed * 7u + (i >> 9)) & 0xff);
}
void fill(void *p, uint64_t off, uint64_t len, unsigned seed);
// check returns -1 when p[off, off+len) holds seed's pattern, else the
// offset of the first wrong byte.
long long check(const void *p, uint64_t off, uint64_t len, unsigned seed);

class Peer {
public:
    explicit Peer(const std::string &mode);
    ~Peer();
    Peer(const Peer &) = delete;
    Peer &operator=(const Peer &) = delete;

    const std::string &name() const { return name_; }
    uint64_t addr() const { return addr_; }
    uint64_t len() const { return len_; }

    // cmd sends one command and returns the reply line (no newline); "" if
    // the peer is gone.
    std::string cmd(const std::string &line);
    // quit asks the peer to exit and returns its exit status (0: clean).
    int quit();

private:
    pid_t pid_ = -1;
    FILE *to_ = nullptr;
    FILE *from_ = nullptr;
    std::string name_;
    uint64_t addr_ = 0, len_ = 0;
};

// peer_main runs the peer side; main() calls it for "--peer MODE".
int peer_main(const std::string &mode);

// self_exe is the path of the test binary (set by main).
extern std::string self_exe;

} // namespace mctest

#endif
