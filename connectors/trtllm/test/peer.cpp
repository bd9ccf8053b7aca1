#include "peer.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "mooncake.hpp"
#include "transfer_engine_c.h"

extern char **environ;

namespace mctest {

std::string self_exe;

void fill(void *p, uint64_t off, uint64_t len, unsigned seed) {
    auto *b = static_cast<uint8_t *>(p);
    for (uint64_t i = 0; i < len; i++) b[off + i] = pattern(off + i, seed);
}

long long check(const void *p, uint64_t off, uint64_t len, unsigned seed) {
    auto *b = static_cast<const uint8_t *>(p);
    for (uint64_t i = 0; i < len; i++)
        if (b[off + i] != pattern(off + i, seed)) return static_cast<long long>(off + i);
    return -1;
}

Peer::Peer(const std::string &mode) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("peer: pipe failed");
    // argv is built before fork: the child of a threaded process may only
    // make async-signal-safe calls until it execs.
    std::string arg0 = self_exe, arg1 = "--peer", arg2 = mode;
    char *argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("peer: fork failed");
    if (pid_ == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execve(argv[0], argv, environ);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    char line[512];
    if (!fgets(line, sizeof line, from_)) throw std::runtime_error("peer: exited before READY");
    char name[256];
    unsigned long long addr = 0, len = 0;
    if (sscanf(line, "READY %255s %llx %llu", name, &addr, &len) != 3)
        throw std::runtime_error(std::string("peer: said ") + line);
    name_ = name;
    addr_ = addr;
    len_ = len;
}

Peer::~Peer() {
    if (pid_ > 0) quit();
}

std::string Peer::cmd(const std::string &line) {
    if (pid_ <= 0) return "";
    fprintf(to_, "%s\n", line.c_str());
    fflush(to_);
    char reply[512];
    if (!fgets(reply, sizeof reply, from_)) return "";
    reply[strcspn(reply, "\n")] = 0;
    return reply;
}

int Peer::quit() {
    if (pid_ <= 0) return -1;
    fputs("QUIT\n", to_);
    fflush(to_);
    fclose(to_);
    fclose(from_);
    int status = 0;
    pid_t pid = std::exchange(pid_, -1);
    if (waitpid(pid, &status, 0) < 0) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

namespace {

// PeerEngine is the peer's engine behind either API.
struct PeerEngine {
    virtual ~PeerEngine() = default;
    virtual std::string name() = 0;
    // take_notifies appends the notifications received so far.
    virtual void take_notifies(std::vector<std::pair<std::string, std::string>> &out) = 0;
    virtual int notify(const std::string &segment, const std::string &name, const std::string &msg) = 0;
    // teardown unregisters and destroys, returning 0 when all went well.
    virtual int teardown() = 0;
};

struct HppPeer : PeerEngine {
    mooncake::Engine engine;
    mooncake::RegisteredMemory mem;
    std::vector<mooncake::Segment> opened;

    HppPeer(mooncake::bytes buf, bool tcp) : engine(config(tcp)), mem(engine.register_memory(buf)) {}
    static mooncake::EngineConfig config(bool tcp) {
        mooncake::EngineConfig c;
        c.host = "127.0.0.1";
        c.transport = tcp ? "tcp" : "";
        return c;
    }
    std::string name() override { return engine.name(); }
    void take_notifies(std::vector<std::pair<std::string, std::string>> &out) override {
        for (auto &n : engine.notifies()) out.emplace_back(n.name, n.msg);
    }
    int notify(const std::string &segment, const std::string &name, const std::string &msg) override {
        try {
            opened.push_back(engine.open_segment(segment));
            opened.back().notify(name, msg);
            return 0;
        } catch (const mooncake::Error &e) {
            return e.status();
        }
    }
    int teardown() override {
        try {
            opened.clear();
            mem.release();
            engine.close();
            return 0;
        } catch (const mooncake::Error &e) {
            std::cerr << "peer: " << e.what() << "\n";
            return 6;
        }
    }
};

struct TePeer : PeerEngine {
    transfer_engine_t te;
    void *buf;

    explicit TePeer(mooncake::bytes b) : buf(b.data()) {
        te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 1);
        if (te == nullptr) throw std::runtime_error("peer: createTransferEngine failed");
        if (registerLocalMemory(te, buf, b.size(), "*", 1) != 0) throw std::runtime_error("peer: registerLocalMemory failed");
    }
    ~TePeer() override { teardown(); }
    int teardown() override {
        if (te == nullptr) return 0;
        int rc = unregisterLocalMemory(te, buf) == 0 ? 0 : 6;
        destroyTransferEngine(std::exchange(te, nullptr));
        return rc;
    }
    std::string name() override {
        char n[256];
        if (getLocalIpAndPort(te, n, sizeof n) != 0) return "";
        return n;
    }
    void take_notifies(std::vector<std::pair<std::string, std::string>> &out) override {
        int n = 0;
        notify_msg_t *ns = getNotifsFromEngine(te, &n);
        for (int i = 0; i < n; i++) out.emplace_back(ns[i].name, ns[i].msg);
        freeNotifsMsgBuf(ns, n);
    }
    int notify(const std::string &segment, const std::string &name, const std::string &msg) override {
        segment_id_t id = openSegment(te, segment.c_str());
        if (id < 0) return id;
        std::string n = name, m = msg;
        notify_msg_t nm{n.data(), m.data()};
        return genNotifyInEngine(te, static_cast<uint64_t>(id), nm);
    }
};

} // namespace

int peer_main(const std::string &mode) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t *>(std::aligned_alloc(4096, kPeerLen)),
                                                       &std::free);
    if (!buf) return 2;
    fill(buf.get(), 0, kPeerLen, 0);
    mooncake::bytes view(reinterpret_cast<std::byte *>(buf.get()), kPeerLen);
    const char *force_tcp = std::getenv("MC_FORCE_TCP");
    bool tcp = force_tcp != nullptr && std::strcmp(force_tcp, "1") == 0;
    std::unique_ptr<PeerEngine> eng;
    try {
        if (mode == "hpp")
            eng = std::make_unique<HppPeer>(view, tcp);
        else if (mode == "te")
            eng = std::make_unique<TePeer>(view);
        else
            return 2;
    } catch (const std::exception &e) {
        std::cerr << "peer: " << e.what() << "\n";
        return 3;
    }
    printf("READY %s %llx %llu\n", eng->name().c_str(), static_cast<unsigned long long>(mooncake::address(buf.get())),
           static_cast<unsigned long long>(kPeerLen));

    std::vector<std::pair<std::string, std::string>> received;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string op;
        in >> op;
        if (op == "QUIT") break;
        if (op == "FILL" || op == "CHECK") {
            uint64_t off = 0, len = 0;
            unsigned seed = 0;
            in >> off >> len >> seed;
            if (off > kPeerLen || len > kPeerLen - off) {
                printf("ERR range\n");
            } else if (op == "FILL") {
                fill(buf.get(), off, len, seed);
                printf("OK\n");
            } else {
                long long bad = check(buf.get(), off, len, seed);
                if (bad < 0)
                    printf("OK\n");
                else
                    printf("BAD %lld\n", bad);
            }
        } else if (op == "WAITNOTIFY") {
            std::string name, msg;
            in >> name >> msg;
            // Notifications have no blocking call to wait on: poll, as
            // TensorRT-LLM's agent does, within a deadline.
            auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            bool found = false;
            for (;;) {
                eng->take_notifies(received);
                for (auto it = received.begin(); it != received.end(); ++it)
                    if (it->first == name && it->second == msg) {
                        received.erase(it);
                        found = true;
                        break;
                    }
                if (found || std::chrono::steady_clock::now() > deadline) break;
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
            printf(found ? "OK\n" : "NONE\n");
        } else if (op == "NOTIFY") {
            std::string seg, name, msg;
            in >> seg >> name >> msg;
            int st = eng->notify(seg, name, msg);
            if (st == 0)
                printf("OK\n");
            else
                printf("ERR %d\n", st);
        } else {
            printf("ERR unknown command\n");
        }
    }
    int rc = eng->teardown();
    eng.reset();
    uint64_t engines = 1, stores = 1;
    mc_debug_live_handles(&engines, &stores, nullptr);
    return rc != 0 ? rc : engines + stores == 0 ? 0 : 7;
}

} // namespace mctest
