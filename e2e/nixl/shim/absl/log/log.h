// A stand-in for the few abseil logging macros that NIXL's headers and its
// Mooncake plugin use (LOG, VLOG, DVLOG, .WithPerror()), so the plugin builds
// out of tree without abseil. Written for this harness; not abseil.
//
// Messages go to stderr. By default WARNING and above are printed;
// NIXL_LOG_LEVEL=INFO, DEBUG or TRACE lowers the threshold (DEBUG enables
// VLOG(1), TRACE VLOG(2)), NIXL_LOG_LEVEL=ERROR raises it. FATAL aborts.
#ifndef NIXL_E2E_SHIM_ABSL_LOG_LOG_H
#define NIXL_E2E_SHIM_ABSL_LOG_LOG_H

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

namespace nixl_e2e_shim {

enum class Severity { INFO = 0, WARNING = 1, ERROR = 2, FATAL = 3 };

// Threshold 0..3 for LOG; a VLOG(n) prints when n <= verbosity.
struct LogLevel {
    int threshold = 1;
    int verbosity = 0;
};

inline const LogLevel &
logLevel() {
    static const LogLevel level = [] {
        LogLevel l;
        const char *env = std::getenv("NIXL_LOG_LEVEL");
        const std::string v = env ? env : "";
        if (v == "TRACE") l = {0, 2};
        else if (v == "DEBUG") l = {0, 1};
        else if (v == "INFO") l = {0, 0};
        else if (v == "ERROR") l = {2, 0};
        else if (v == "FATAL") l = {3, 0};
        return l;
    }();
    return level;
}

inline bool
enabled(Severity s) {
    return s == Severity::FATAL || static_cast<int>(s) >= logLevel().threshold;
}

inline bool
vlogEnabled(int n) {
    return n <= logLevel().verbosity;
}

// One message: collects what is streamed into it and prints it, as a single
// line, when the full expression that made it ends.
class LogMessage {
public:
    LogMessage(Severity s, const char *file, int line) : sev_(s), errno_(errno) {
        static const char tags[] = "IWEF";
        const char *base = std::strrchr(file, '/');
        out_ << tags[static_cast<int>(s)] << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
    }

    LogMessage(const LogMessage &) = delete;
    LogMessage &operator=(const LogMessage &) = delete;

    ~LogMessage() {
        if (perror_) out_ << ": " << std::strerror(errno_) << " [" << errno_ << "]";
        out_ << '\n';
        std::cerr << out_.str() << std::flush;
        if (sev_ == Severity::FATAL) std::abort();
    }

    LogMessage &
    self() {
        return *this;
    }

    // Appends the text of the errno seen when the message began.
    LogMessage &
    WithPerror() {
        perror_ = true;
        return *this;
    }

    template<typename T>
    LogMessage &
    operator<<(const T &v) {
        out_ << v;
        return *this;
    }

    LogMessage &
    operator<<(std::ostream &(*manip)(std::ostream &)) {
        out_ << manip;
        return *this;
    }

private:
    Severity sev_;
    int errno_;
    bool perror_ = false;
    std::ostringstream out_;
};

// Turns "msg << a << b" into void, so a disabled message is the untaken arm
// of a conditional and streams nothing (abseil's macros behave the same).
struct Voidify {
    void
    operator&(LogMessage &) const {}
};

} // namespace nixl_e2e_shim

#define NIXL_E2E_SHIM_LOG_IF(sev, cond) \
    !(cond) ? (void)0 : ::nixl_e2e_shim::Voidify() & \
        ::nixl_e2e_shim::LogMessage(sev, __FILE__, __LINE__).self()

#define LOG(sev) \
    NIXL_E2E_SHIM_LOG_IF(::nixl_e2e_shim::Severity::sev, \
                         ::nixl_e2e_shim::enabled(::nixl_e2e_shim::Severity::sev))

#define VLOG(n) \
    NIXL_E2E_SHIM_LOG_IF(::nixl_e2e_shim::Severity::INFO, ::nixl_e2e_shim::vlogEnabled(n))

#ifdef NDEBUG
#define DVLOG(n) NIXL_E2E_SHIM_LOG_IF(::nixl_e2e_shim::Severity::INFO, false)
#else
#define DVLOG(n) VLOG(n)
#endif

#endif
