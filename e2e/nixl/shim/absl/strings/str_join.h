// absl::StrJoin and absl::PairFormatter, as far as NIXL's descriptor code
// uses them (joining a container, optionally through a formatter that
// appends one element to a string). Written for this harness; not abseil.
#ifndef NIXL_E2E_SHIM_ABSL_STRINGS_STR_JOIN_H
#define NIXL_E2E_SHIM_ABSL_STRINGS_STR_JOIN_H

#include <sstream>
#include <string>
#include <string_view>

namespace absl {

// Formats a std::pair as "first<sep>second".
class PairFormatter {
public:
    explicit PairFormatter(std::string_view sep) : sep_(sep) {}

    template<typename Pair>
    void
    operator()(std::string *out, const Pair &p) const {
        std::ostringstream s;
        s << p.first << sep_ << p.second;
        out->append(s.str());
    }

private:
    std::string sep_;
};

template<typename Range, typename Formatter>
std::string
StrJoin(const Range &range, std::string_view sep, Formatter &&fmt) {
    std::string out;
    bool first = true;
    for (const auto &elem : range) {
        if (!first) out.append(sep);
        first = false;
        fmt(&out, elem);
    }
    return out;
}

template<typename Range>
std::string
StrJoin(const Range &range, std::string_view sep) {
    return StrJoin(range, sep, [](std::string *out, const auto &elem) {
        std::ostringstream s;
        s << elem;
        out->append(s.str());
    });
}

} // namespace absl

#endif
