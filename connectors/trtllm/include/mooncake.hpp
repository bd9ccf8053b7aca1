// mooncake.hpp - header-only C++17 API of mooncake-go, over mooncake.h.
//
// RAII owners for what the C ABI hands out (an Engine, memory registered
// with it, an opened Segment, a Batch of transfers, a Store client and the
// buffers registered with it), errors as exceptions (mooncake::Error, with
// the status code, its domain and the library's message) and buffers as
// views (mooncake::span: pointer and length, never a copy of the bytes).
//
//   mooncake::Engine engine;                            // P2PHANDSHAKE, defaults
//   auto mem = engine.register_memory(mooncake::as_writable_bytes(buf));
//   mooncake::Segment peer = engine.open_segment("10.0.0.7:15123");
//   mooncake::Batch batch = engine.allocate_batch(64);
//   mooncake::Request req = mooncake::write(mem.view(), peer, remote_addr);
//   batch.submit_with_notify({&req, 1}, "ctx-0", "done");
//   batch.wait();                                       // throws on failure
//
// Lifetimes follow the C ABI: destroy what an Engine issued (registered
// memory, segments, batches) before the Engine, and a Store's buffers
// before the Store (owners left behind only fail their calls with
// MC_ERR_INVALID_HANDLE: handles are never reused); payload memory must
// stay valid until the transfers using it are final (a Batch waits for its
// tasks before it frees itself). Owners are move-only; a
// moved-from owner holds nothing and its calls throw MC_ERR_INVALID_HANDLE.
// Every call may be made from any thread (the C ABI's guarantee).
//
// Link with mooncake::mooncake (CMake) or `pkg-config mooncake`.
#ifndef MOONCAKE_HPP
#define MOONCAKE_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mooncake.h"

namespace mooncake {

// ---------------------------------------------------------------------------
// Errors

// Error is a failed call: the mc_status_t it returned, the table the code
// belongs to (MC_DOMAIN_*) and the library's message.
class Error : public std::runtime_error {
public:
    Error(mc_status_t status, int32_t domain, const std::string &message)
        : std::runtime_error(message), status_(status), domain_(domain) {}

    mc_status_t status() const noexcept { return status_; }
    int32_t domain() const noexcept { return domain_; }
    // name is the code's symbolic name ("INVALID_HANDLE", "BATCH_BUSY", ...).
    const char *name() const noexcept { return mc_status_name(domain_, status_); }

private:
    mc_status_t status_;
    int32_t domain_;
};

namespace detail {

// Call holds the mc_error_t of one C call, so that a failure becomes an
// Error carrying the library's own message.
struct Call {
    mc_error_t err{};

    void check(mc_status_t st, const char *what) const {
        if (st == MC_OK) return;
        // The library fills err on failure; domain ABI covers a call that
        // failed before it could (never expected, but never unexplained).
        int32_t domain = err.code == st ? err.domain : MC_DOMAIN_ABI;
        std::string msg = std::string("mooncake: ") + what + ": ";
        msg += err.code == st && err.message[0] != '\0' ? err.message : mc_status_name(domain, st);
        throw Error(st, domain, msg);
    }
};

// check runs one C call that takes a trailing mc_error_t* and throws its
// failure: check("open segment", mc_engine_open_segment, e, name, &seg).
template <class Fn, class... Args>
void check(const char *what, Fn fn, Args... args) {
    Call c;
    c.check(fn(args..., &c.err), what);
}

// read_string reads a string the library writes with the len_out
// protocol (mc_engine_name, mc_store_name), retrying once at full size.
template <class Fn>
std::string read_string(const char *what, Fn fn, uint64_t handle) {
    char buf[256];
    std::size_t n = 0;
    Call c;
    mc_status_t st = fn(handle, buf, sizeof buf, &n, &c.err);
    if (st != MC_ERR_BUFFER_TOO_SMALL) {
        c.check(st, what);
        return std::string(buf, n - 1);
    }
    std::string s(n, '\0');
    check(what, fn, handle, s.data(), s.size(), &n);
    s.resize(n - 1);
    return s;
}

[[noreturn]] inline void invalid(const char *what) {
    throw Error(MC_ERR_INVALID_HANDLE, MC_DOMAIN_ABI, std::string("mooncake: ") + what + ": no handle (moved from)");
}

} // namespace detail

// check_abi throws unless the loaded library serves the ABI this header was
// written for (same major version, at least this minor).
inline void check_abi() {
    uint32_t v = mc_abi_version();
    if ((v >> 16) != MC_ABI_VERSION_MAJOR || (v & 0xffff) < MC_ABI_VERSION_MINOR)
        // MC_ERR_STRUCT_SIZE: the ABI's code for "not this version's layout".
        throw Error(MC_ERR_STRUCT_SIZE, MC_DOMAIN_ABI,
                    "mooncake: library ABI " + std::to_string(v >> 16) + "." + std::to_string(v & 0xffff) +
                        " does not serve header ABI " + std::to_string(MC_ABI_VERSION_MAJOR) + "." +
                        std::to_string(MC_ABI_VERSION_MINOR));
}

// ---------------------------------------------------------------------------
// Views

// span is a view of count Ts at data (C++20's std::span, the part needed
// here): buffers are passed as views, never copied.
template <class T>
class span {
public:
    using element_type = T;
    using value_type = std::remove_cv_t<T>;
    using iterator = T *;

    constexpr span() noexcept = default;
    constexpr span(T *data, std::size_t size) noexcept : data_(data), size_(size) {}
    template <std::size_t N>
    constexpr span(T (&arr)[N]) noexcept : data_(arr), size_(N) {}
    // Any contiguous container with data() and size() of Ts (std::vector,
    // std::array, std::string for char, a span of non-const T).
    template <class C, class = std::enable_if_t<!std::is_same_v<std::decay_t<C>, span> &&
                                                std::is_convertible_v<decltype(std::declval<C &>().data()), T *>>>
    constexpr span(C &&c) noexcept : data_(c.data()), size_(c.size()) {}

    constexpr T *data() const noexcept { return data_; }
    constexpr std::size_t size() const noexcept { return size_; }
    constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
    constexpr bool empty() const noexcept { return size_ == 0; }
    constexpr T &operator[](std::size_t i) const noexcept { return data_[i]; }
    constexpr T *begin() const noexcept { return data_; }
    constexpr T *end() const noexcept { return data_ + size_; }

    // subspan is count Ts from offset (to the end when count is npos); out
    // of range throws, as a view past its buffer would corrupt memory.
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);
    span subspan(std::size_t offset, std::size_t count = npos) const {
        if (offset > size_ || (count != npos && count > size_ - offset))
            throw std::out_of_range("mooncake::span::subspan: range past the end");
        return span(data_ + offset, count == npos ? size_ - offset : count);
    }

private:
    T *data_ = nullptr;
    std::size_t size_ = 0;
};

using bytes = span<std::byte>;
using const_bytes = span<const std::byte>;

namespace detail {
template <class T>
struct is_span : std::false_type {};
template <class T>
struct is_span<span<T>> : std::true_type {};
} // namespace detail

// as_bytes and as_writable_bytes view a span, or any contiguous container
// (std::vector, std::array, std::string), as bytes.
template <class T>
const_bytes as_bytes(span<T> s) noexcept {
    return {reinterpret_cast<const std::byte *>(s.data()), s.size_bytes()};
}
template <class C, class = std::enable_if_t<!detail::is_span<C>::value>>
const_bytes as_bytes(const C &c) noexcept {
    return {reinterpret_cast<const std::byte *>(c.data()), c.size() * sizeof(*c.data())};
}
template <class T, class = std::enable_if_t<!std::is_const_v<T>>>
bytes as_writable_bytes(span<T> s) noexcept {
    return {reinterpret_cast<std::byte *>(s.data()), s.size_bytes()};
}
template <class C, class = std::enable_if_t<!detail::is_span<C>::value &&
                                            !std::is_const_v<std::remove_pointer_t<decltype(std::declval<C &>().data())>>>>
bytes as_writable_bytes(C &c) noexcept {
    return {reinterpret_cast<std::byte *>(c.data()), c.size() * sizeof(*c.data())};
}

// address is the integer form of a pointer, as remote addresses are given.
inline uint64_t address(const void *p) noexcept { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

// ---------------------------------------------------------------------------
// Transfer Engine

// EngineConfig is mc_engine_config_t with strings: an empty string or a
// zero means the default mooncake.h documents for the field.
struct EngineConfig {
    std::string metadata;          // "" = P2PHANDSHAKE
    std::string local_server_name; // this engine's segment name
    std::string host;              // address peers reach it at
    std::string transport;         // "" = auto, "tcp", "shm"
    std::string secret;
    uint32_t lanes = 0;
    uint32_t rpc_port = 0;
    uint32_t data_port = 0;
    uint64_t slice_size = 0;
    std::chrono::milliseconds timeout{0}; // per-request deadline
    uint32_t max_retries = 0;
};

// Request is one transfer (mc_request_t itself, so an array of Requests is
// handed to the library as it is). Build them with read() and write().
using Request = mc_request_t;

// State is a task's or batch's state, numbered as Mooncake's STATUS_*.
enum class State : int32_t {
    waiting = MC_TRANSFER_WAITING,
    pending = MC_TRANSFER_PENDING,
    invalid = MC_TRANSFER_INVALID,
    canceled = MC_TRANSFER_CANCELED,
    completed = MC_TRANSFER_COMPLETED,
    timeout = MC_TRANSFER_TIMEOUT,
    failed = MC_TRANSFER_FAILED,
};

// TransferStatus is the state of a task or a batch.
struct TransferStatus {
    State state = State::waiting;
    mc_status_t error = MC_OK;  // the failure's code, else MC_OK
    uint64_t transferred = 0;   // bytes in place so far

    bool done() const noexcept { return state != State::waiting && state != State::pending; }
    bool ok() const noexcept { return state == State::completed; }

    static TransferStatus from(const mc_transfer_status_t &s) noexcept {
        return {static_cast<State>(s.state), s.error_code, s.transferred};
    }
};

// Notify is a notification received from a peer engine.
struct Notify {
    std::string name;
    std::string msg;
};

class Engine;

// Segment is a peer's segment opened by an Engine; closing it (the
// destructor) makes the engine forget it. The engine gives one id per name:
// open each name once and share the Segment, as a second one would close
// the id under the first.
class Segment {
public:
    Segment() noexcept = default;
    Segment(Segment &&o) noexcept : engine_(std::exchange(o.engine_, 0)), id_(o.id_) {}
    Segment &operator=(Segment &&o) noexcept {
        if (this != &o) {
            reset();
            engine_ = std::exchange(o.engine_, 0);
            id_ = o.id_;
        }
        return *this;
    }
    Segment(const Segment &) = delete;
    Segment &operator=(const Segment &) = delete;
    ~Segment() { reset(); }

    mc_segment_t id() const noexcept { return id_; }
    explicit operator bool() const noexcept { return engine_ != 0; }

    // buffers lists the memory the peer published, in registration order.
    std::vector<mc_buffer_desc_t> buffers() const {
        if (engine_ == 0) detail::invalid("segment buffers");
        // The count comes with MC_ERR_BUFFER_TOO_SMALL: grow and ask again
        // (the peer may register more meanwhile).
        std::vector<mc_buffer_desc_t> out(8);
        for (;;) {
            std::size_t n = 0;
            detail::Call c;
            mc_status_t st = mc_engine_segment_buffers(engine_, id_, out.data(), out.size(), &n, &c.err);
            if (st == MC_ERR_BUFFER_TOO_SMALL && n > out.size()) {
                out.resize(n);
                continue;
            }
            c.check(st, "segment buffers");
            out.resize(n);
            return out;
        }
    }

    // notify sends (name, msg) to the peer's engine.
    void notify(const std::string &name, const std::string &msg) const {
        if (engine_ == 0) detail::invalid("send notify");
        detail::check("send notify", mc_engine_send_notify, engine_, id_, name.c_str(), msg.c_str());
    }

    // close forgets the segment now, reporting a failure.
    void close() {
        if (engine_ == 0) return;
        mc_engine_t e = std::exchange(engine_, 0);
        detail::check("close segment", mc_engine_close_segment, e, id_);
    }

private:
    friend class Engine;
    Segment(mc_engine_t e, mc_segment_t id) noexcept : engine_(e), id_(id) {}
    void reset() noexcept {
        if (engine_ != 0) mc_engine_close_segment(std::exchange(engine_, 0), id_, nullptr);
    }

    mc_engine_t engine_ = 0;
    mc_segment_t id_ = 0;
};

// read is a request that copies length bytes at remote_addr of segment into
// local; write the other way. local must lie in registered memory.
inline Request read(bytes local, const Segment &segment, uint64_t remote_addr) noexcept {
    return Request{MC_OP_READ, 0, local.data(), segment.id(), remote_addr, local.size()};
}
inline Request write(const_bytes local, const Segment &segment, uint64_t remote_addr) noexcept {
    // The library only reads local memory of a write.
    return Request{MC_OP_WRITE, 0, const_cast<std::byte *>(local.data()), segment.id(), remote_addr, local.size()};
}

// RegisteredMemory is memory registered with an Engine, unregistered by the
// destructor. The memory itself stays the caller's (or, for
// Engine::allocate_buffer, the engine's, freed here).
class RegisteredMemory {
public:
    RegisteredMemory() noexcept = default;
    RegisteredMemory(RegisteredMemory &&o) noexcept
        : engine_(std::exchange(o.engine_, 0)), mem_(o.mem_), allocated_(o.allocated_) {}
    RegisteredMemory &operator=(RegisteredMemory &&o) noexcept {
        if (this != &o) {
            reset();
            engine_ = std::exchange(o.engine_, 0);
            mem_ = o.mem_;
            allocated_ = o.allocated_;
        }
        return *this;
    }
    RegisteredMemory(const RegisteredMemory &) = delete;
    RegisteredMemory &operator=(const RegisteredMemory &) = delete;
    ~RegisteredMemory() { reset(); }

    bytes view() const noexcept { return mem_; }
    std::byte *data() const noexcept { return mem_.data(); }
    std::size_t size() const noexcept { return mem_.size(); }
    uint64_t address() const noexcept { return mooncake::address(mem_.data()); }
    explicit operator bool() const noexcept { return engine_ != 0; }

    // release unregisters (and frees what the engine allocated) now,
    // reporting a failure.
    void release() {
        if (engine_ == 0) return;
        mc_engine_t e = std::exchange(engine_, 0);
        if (allocated_)
            detail::check("free buffer", mc_engine_free_buffer, e, static_cast<void *>(mem_.data()));
        else
            detail::check("unregister memory", mc_engine_unregister_memory, e, static_cast<void *>(mem_.data()));
    }

private:
    friend class Engine;
    RegisteredMemory(mc_engine_t e, bytes mem, bool allocated) noexcept
        : engine_(e), mem_(mem), allocated_(allocated) {}
    void reset() noexcept {
        if (engine_ == 0) return;
        mc_engine_t e = std::exchange(engine_, 0);
        if (allocated_)
            mc_engine_free_buffer(e, mem_.data(), nullptr);
        else
            mc_engine_unregister_memory(e, mem_.data(), nullptr);
    }

    mc_engine_t engine_ = 0;
    bytes mem_;
    bool allocated_ = false;
};

// Batch is a batch of transfers of an Engine. The destructor waits for the
// tasks still running (each has the engine's deadline), then frees it, so
// payload memory outlives the transfers that use it when it outlives the
// Batch.
class Batch {
public:
    Batch() noexcept = default;
    Batch(Batch &&o) noexcept : engine_(std::exchange(o.engine_, 0)), id_(o.id_) {}
    Batch &operator=(Batch &&o) noexcept {
        if (this != &o) {
            reset();
            engine_ = std::exchange(o.engine_, 0);
            id_ = o.id_;
        }
        return *this;
    }
    Batch(const Batch &) = delete;
    Batch &operator=(const Batch &) = delete;
    ~Batch() { reset(); }

    mc_batch_t id() const noexcept { return id_; }
    explicit operator bool() const noexcept { return engine_ != 0; }

    // submit starts the requests as the batch's next tasks; all are checked
    // before any starts.
    void submit(span<const Request> requests) const {
        if (engine_ == 0) detail::invalid("submit");
        detail::check("submit", mc_engine_submit, engine_, id_, requests.data(), requests.size());
    }

    // submit_with_notify is submit that sends (name, msg) to the first
    // request's segment once every task of the batch has completed.
    void submit_with_notify(span<const Request> requests, const std::string &name, const std::string &msg) const {
        if (engine_ == 0) detail::invalid("submit with notify");
        detail::check("submit with notify", mc_engine_submit_with_notify, engine_, id_, requests.data(),
                      requests.size(), name.c_str(), msg.c_str());
    }

    // task is the status of task i (its index in submission order).
    TransferStatus task(uint64_t i) const {
        if (engine_ == 0) detail::invalid("task status");
        mc_transfer_status_t s{};
        detail::check("task status", mc_engine_task_status, engine_, id_, i, &s);
        return TransferStatus::from(s);
    }

    // status sums the batch up: pending while a task runs, then completed
    // or the first failure.
    TransferStatus status() const {
        if (engine_ == 0) detail::invalid("batch status");
        mc_transfer_status_t s{};
        detail::check("batch status", mc_engine_batch_status, engine_, id_, &s);
        return TransferStatus::from(s);
    }

    // wait blocks until every task is final and throws unless all
    // completed; with a timeout, running out of time throws MC_ERR_TIMED_OUT.
    TransferStatus wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) const {
        if (engine_ == 0) detail::invalid("wait");
        mc_transfer_status_t s{};
        detail::check("wait", mc_engine_wait, engine_, id_, static_cast<int64_t>(timeout.count()), &s);
        return TransferStatus::from(s);
    }

    // free releases the batch now, reporting a failure (MC_TE_ERR_BATCH_BUSY
    // while tasks run; the Batch then still holds it).
    void free() {
        if (engine_ == 0) return;
        detail::check("free batch", mc_engine_free_batch, engine_, id_);
        engine_ = 0;
    }

private:
    friend class Engine;
    Batch(mc_engine_t e, mc_batch_t id) noexcept : engine_(e), id_(id) {}
    void reset() noexcept {
        if (engine_ == 0) return;
        mc_engine_t e = std::exchange(engine_, 0);
        if (mc_engine_free_batch(e, id_, nullptr) == MC_TE_ERR_BATCH_BUSY) {
            mc_engine_wait(e, id_, -1, nullptr, nullptr);
            mc_engine_free_batch(e, id_, nullptr);
        }
    }

    mc_engine_t engine_ = 0;
    mc_batch_t id_ = 0;
};

// Engine is a Transfer Engine: it registers memory of this process, opens
// peers' segments and moves bytes between them in batches.
class Engine {
public:
    // Engine() starts an engine with every default (P2PHANDSHAKE, a free
    // port, the default transport).
    Engine() : Engine(EngineConfig{}) {}
    explicit Engine(const EngineConfig &cfg) {
        mc_engine_config_t c;
        mc_engine_config_init(&c);
        auto str = [](const std::string &s) { return s.empty() ? nullptr : s.c_str(); };
        c.metadata = str(cfg.metadata);
        c.local_server_name = str(cfg.local_server_name);
        c.host = str(cfg.host);
        c.transport = str(cfg.transport);
        c.secret = str(cfg.secret);
        c.lanes = cfg.lanes;
        c.rpc_port = cfg.rpc_port;
        c.data_port = cfg.data_port;
        c.slice_size = cfg.slice_size;
        c.timeout_ms = static_cast<uint64_t>(cfg.timeout.count());
        c.max_retries = cfg.max_retries;
        detail::check("create engine", mc_engine_create, static_cast<const mc_engine_config_t *>(&c), &handle_);
    }
    Engine(Engine &&o) noexcept : handle_(std::exchange(o.handle_, 0)) {}
    Engine &operator=(Engine &&o) noexcept {
        if (this != &o) {
            reset();
            handle_ = std::exchange(o.handle_, 0);
        }
        return *this;
    }
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;
    // The destructor fails the transfers still in flight and closes the
    // engine; destroy the owners it issued first.
    ~Engine() { reset(); }

    mc_engine_t handle() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != 0; }

    // name is the segment name peers open ("host:port" in P2PHANDSHAKE).
    std::string name() const { return detail::read_string("engine name", mc_engine_name, handle_); }

    // rpc_port and data_port are the handshake and TCP data ports.
    uint32_t rpc_port() const {
        uint32_t p = 0;
        detail::check("engine ports", mc_engine_ports, handle_, &p, static_cast<uint32_t *>(nullptr));
        return p;
    }
    uint32_t data_port() const {
        uint32_t p = 0;
        detail::check("engine ports", mc_engine_ports, handle_, static_cast<uint32_t *>(nullptr), &p);
        return p;
    }

    // register_memory makes mem usable in requests (and, remote_accessible,
    // readable and writable by peers) until the result is destroyed.
    // location "" is "cpu:0".
    RegisteredMemory register_memory(bytes mem, const std::string &location = "", bool remote_accessible = true) const {
        detail::check("register memory", mc_engine_register_memory, handle_, static_cast<void *>(mem.data()),
                      static_cast<uint64_t>(mem.size()), location.empty() ? nullptr : location.c_str(),
                      remote_accessible ? 1 : 0);
        return RegisteredMemory(handle_, mem, false);
    }

    // allocate_buffer maps size bytes of shared memory registered
    // remote-accessible (one memcpy to a peer on this host); the result
    // frees it.
    RegisteredMemory allocate_buffer(std::size_t size, const std::string &location = "") const {
        void *p = nullptr;
        detail::check("allocate buffer", mc_engine_allocate_buffer, handle_, static_cast<uint64_t>(size),
                      location.empty() ? nullptr : location.c_str(), &p);
        return RegisteredMemory(handle_, bytes(static_cast<std::byte *>(p), size), true);
    }

    // open_segment resolves a peer by segment name; see Segment about
    // opening a name twice.
    Segment open_segment(const std::string &name) const {
        mc_segment_t id = 0;
        detail::Call c;
        c.check(mc_engine_open_segment(handle_, name.c_str(), &id, &c.err), ("open segment " + name).c_str());
        return Segment(handle_, id);
    }

    // allocate_batch returns a batch of up to capacity tasks.
    Batch allocate_batch(uint32_t capacity) const {
        mc_batch_t id = 0;
        detail::check("allocate batch", mc_engine_allocate_batch, handle_, capacity, &id);
        return Batch(handle_, id);
    }

    // notifies takes the notifications received so far, oldest first.
    std::vector<Notify> notifies() const {
        mc_notify_t *arr = nullptr;
        std::size_t n = 0;
        detail::check("get notifies", mc_engine_get_notifies, handle_, &arr, &n);
        std::vector<Notify> out;
        try {
            out.reserve(n);
            for (std::size_t i = 0; i < n; i++)
                out.push_back({std::string(arr[i].name, arr[i].name_len), std::string(arr[i].msg, arr[i].msg_len)});
        } catch (...) {
            mc_notifies_free(arr, n);
            throw;
        }
        mc_notifies_free(arr, n);
        return out;
    }

    // close destroys the engine now, reporting a failure.
    void close() {
        if (handle_ == 0) return;
        detail::check("destroy engine", mc_engine_destroy, std::exchange(handle_, 0));
    }

private:
    void reset() noexcept {
        if (handle_ != 0) mc_engine_destroy(std::exchange(handle_, 0), nullptr);
    }

    mc_engine_t handle_ = 0;
};

// ---------------------------------------------------------------------------
// Store

// StoreConfig is mc_store_config_t with strings; "" and 0 mean the defaults
// mooncake.h documents. master is required.
struct StoreConfig {
    std::string master;         // "host:port" or "etcd://h1:2379;h2:2379"
    std::string local_hostname;
    std::string metadata;       // "" = P2PHANDSHAKE
    std::string protocol;       // "" = tcp
    std::string cluster_id;
    uint32_t replicas = 0;
    int64_t segment_size = 0;      // bytes contributed to the pool; -1: none
    int64_t local_buffer_size = 0; // staging buffer
    std::chrono::milliseconds rpc_timeout{0};
    const Engine *engine = nullptr; // an engine to share (it must outlive the store)
    bool no_checksum = false;
};

// StoreBuffer is memory registered with a Store (put_from and get_into use
// it without a staging copy), unregistered by the destructor.
class StoreBuffer {
public:
    StoreBuffer() noexcept = default;
    StoreBuffer(StoreBuffer &&o) noexcept : store_(std::exchange(o.store_, 0)), mem_(o.mem_) {}
    StoreBuffer &operator=(StoreBuffer &&o) noexcept {
        if (this != &o) {
            reset();
            store_ = std::exchange(o.store_, 0);
            mem_ = o.mem_;
        }
        return *this;
    }
    StoreBuffer(const StoreBuffer &) = delete;
    StoreBuffer &operator=(const StoreBuffer &) = delete;
    ~StoreBuffer() { reset(); }

    bytes view() const noexcept { return mem_; }
    explicit operator bool() const noexcept { return store_ != 0; }

private:
    friend class Store;
    StoreBuffer(mc_store_t s, bytes mem) noexcept : store_(s), mem_(mem) {}
    void reset() noexcept {
        if (store_ != 0) mc_store_unregister_buffer(std::exchange(store_, 0), mem_.data(), nullptr);
    }

    mc_store_t store_ = 0;
    bytes mem_;
};

// Store is a Mooncake Store client: its memory joins the pool, and it puts
// and gets objects by key. Batch calls return one status per key and throw
// only when the call as a whole failed.
class Store {
public:
    explicit Store(const StoreConfig &cfg) {
        mc_store_config_t c;
        mc_store_config_init(&c);
        auto str = [](const std::string &s) { return s.empty() ? nullptr : s.c_str(); };
        c.master = str(cfg.master);
        c.local_hostname = str(cfg.local_hostname);
        c.metadata = str(cfg.metadata);
        c.protocol = str(cfg.protocol);
        c.cluster_id = str(cfg.cluster_id);
        c.replicas = cfg.replicas;
        c.segment_size = cfg.segment_size;
        c.local_buffer_size = cfg.local_buffer_size;
        c.rpc_timeout_ms = static_cast<uint64_t>(cfg.rpc_timeout.count());
        c.engine = cfg.engine ? cfg.engine->handle() : 0;
        c.no_checksum = cfg.no_checksum ? 1 : 0;
        detail::check("create store", mc_store_create, static_cast<const mc_store_config_t *>(&c), &handle_);
    }
    Store(Store &&o) noexcept : handle_(std::exchange(o.handle_, 0)) {}
    Store &operator=(Store &&o) noexcept {
        if (this != &o) {
            reset();
            handle_ = std::exchange(o.handle_, 0);
        }
        return *this;
    }
    Store(const Store &) = delete;
    Store &operator=(const Store &) = delete;
    ~Store() { reset(); }

    mc_store_t handle() const noexcept { return handle_; }

    std::string name() const { return detail::read_string("store name", mc_store_name, handle_); }

    StoreBuffer register_buffer(bytes mem) const {
        detail::check("register buffer", mc_store_register_buffer, handle_, static_cast<void *>(mem.data()),
                      static_cast<uint64_t>(mem.size()));
        return StoreBuffer(handle_, mem);
    }

    // put stores value under key, write-once (an existing key is kept).
    void put(const std::string &key, const_bytes value, const mc_replicate_config_t *rc = nullptr) const {
        detail::check("put", mc_store_put, handle_, key.c_str(), static_cast<const void *>(value.data()),
                      static_cast<uint64_t>(value.size()), rc);
    }
    // put_from is put of a value inside a registered StoreBuffer.
    void put_from(const std::string &key, const_bytes value, const mc_replicate_config_t *rc = nullptr) const {
        detail::check("put from", mc_store_put_from, handle_, key.c_str(), static_cast<const void *>(value.data()),
                      static_cast<uint64_t>(value.size()), rc);
    }
    // upsert stores value under key, replacing an existing value.
    void upsert(const std::string &key, const_bytes value, const mc_replicate_config_t *rc = nullptr) const {
        detail::check("upsert", mc_store_upsert, handle_, key.c_str(), static_cast<const void *>(value.data()),
                      static_cast<uint64_t>(value.size()), rc);
    }

    // get_into reads key's value into buf (straight into a registered
    // StoreBuffer) and returns its length.
    std::size_t get_into(const std::string &key, bytes buf) const {
        uint64_t n = 0;
        detail::check("get into", mc_store_get_into, handle_, key.c_str(), static_cast<void *>(buf.data()),
                      static_cast<uint64_t>(buf.size()), &n);
        return static_cast<std::size_t>(n);
    }

    // get reads key's value into a new vector of its size.
    std::vector<std::byte> get(const std::string &key) const {
        std::vector<std::byte> out(size(key));
        for (;;) {
            uint64_t n = 0;
            detail::Call c;
            mc_status_t st = mc_store_get(handle_, key.c_str(), out.data(), out.size(), &n, &c.err);
            if (st == MC_ERR_BUFFER_TOO_SMALL && n > out.size()) { // an upsert grew it meanwhile
                out.resize(n);
                continue;
            }
            c.check(st, "get");
            out.resize(n);
            return out;
        }
    }

    std::size_t size(const std::string &key) const {
        uint64_t n = 0;
        detail::check("get size", mc_store_get_size, handle_, key.c_str(), &n);
        return static_cast<std::size_t>(n);
    }

    bool exists(const std::string &key) const {
        int32_t e = 0;
        detail::check("exist", mc_store_exist, handle_, key.c_str(), &e);
        return e != 0;
    }

    void remove(const std::string &key, bool force = false) const {
        detail::check("remove", mc_store_remove, handle_, key.c_str(), force ? 1 : 0);
    }

    uint64_t remove_all(bool force = false) const {
        uint64_t n = 0;
        detail::check("remove all", mc_store_remove_all, handle_, force ? 1 : 0, &n);
        return n;
    }

    // batch_put_from puts values[i] (each inside a registered StoreBuffer)
    // under keys[i] in one master round trip per phase; one code per key.
    std::vector<mc_status_t> batch_put_from(span<const std::string> keys, span<const const_bytes> values,
                                            const mc_replicate_config_t *rc = nullptr) const {
        same_count(keys.size(), values.size(), "batch put from");
        std::vector<const char *> k = c_keys(keys);
        std::vector<const void *> bufs(values.size());
        std::vector<uint64_t> lens(values.size());
        for (std::size_t i = 0; i < values.size(); i++) {
            bufs[i] = values[i].data();
            lens[i] = values[i].size();
        }
        std::vector<mc_status_t> codes(keys.size());
        detail::Call c;
        batch_check(c, "batch put from",
                    mc_store_batch_put_from(handle_, k.data(), bufs.data(), lens.data(), k.size(), rc, codes.data(),
                                            &c.err));
        return codes;
    }

    // batch_get_into reads keys[i] into bufs[i]; lens (if given) receives
    // each value's length. One code per key.
    std::vector<mc_status_t> batch_get_into(span<const std::string> keys, span<const bytes> bufs,
                                            std::vector<uint64_t> *lens = nullptr) const {
        same_count(keys.size(), bufs.size(), "batch get into");
        std::vector<const char *> k = c_keys(keys);
        std::vector<void *> ptrs(bufs.size());
        std::vector<uint64_t> caps(bufs.size()), got(bufs.size());
        for (std::size_t i = 0; i < bufs.size(); i++) {
            ptrs[i] = bufs[i].data();
            caps[i] = bufs[i].size();
        }
        std::vector<mc_status_t> codes(keys.size());
        detail::Call c;
        batch_check(c, "batch get into",
                    mc_store_batch_get_into(handle_, k.data(), ptrs.data(), caps.data(), k.size(), got.data(),
                                            codes.data(), &c.err));
        if (lens) *lens = std::move(got);
        return codes;
    }

    // batch_exists answers per key; a key the master refused reads false.
    std::vector<bool> batch_exists(span<const std::string> keys) const {
        std::vector<const char *> k = c_keys(keys);
        std::vector<int32_t> e(keys.size());
        std::vector<mc_status_t> codes(keys.size());
        detail::Call c;
        batch_check(c, "batch exist", mc_store_batch_exist(handle_, k.data(), k.size(), e.data(), codes.data(), &c.err));
        return std::vector<bool>(e.begin(), e.end());
    }

    void close() {
        if (handle_ == 0) return;
        detail::check("close store", mc_store_close, std::exchange(handle_, 0));
    }

private:
    static std::vector<const char *> c_keys(span<const std::string> keys) {
        std::vector<const char *> k(keys.size());
        for (std::size_t i = 0; i < keys.size(); i++) k[i] = keys[i].c_str();
        return k;
    }
    static void same_count(std::size_t keys, std::size_t values, const char *what) {
        if (keys != values)
            throw Error(MC_STORE_ERR_INVALID_PARAMS, MC_DOMAIN_STORE,
                        std::string("mooncake: ") + what + ": " + std::to_string(keys) + " keys but " +
                            std::to_string(values) + " buffers");
    }
    // batch_check throws what failed the call as a whole (the ABI's own
    // codes: a bad handle, a NULL argument); a store code is the first
    // failing key's, and every key's is in the codes returned.
    static void batch_check(const detail::Call &c, const char *what, mc_status_t st) {
        if (st != MC_OK && c.err.code == st && c.err.domain == MC_DOMAIN_STORE) return;
        c.check(st, what);
    }
    void reset() noexcept {
        if (handle_ != 0) mc_store_close(std::exchange(handle_, 0), nullptr);
    }

    mc_store_t handle_ = 0;
};

} // namespace mooncake

#endif // MOONCAKE_HPP
