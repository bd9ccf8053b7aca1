// nixl::config::getValueDefaulted, as NIXL's Mooncake plugin uses it (for
// NIXL_MOONCAKE_IP_ADDR): the environment variable's value, or the fallback
// when it is unset. NIXL's own configuration header also reads a TOML file
// (toml++); no test here sets one, so this stand-in reads the environment
// only. Written for this harness; it shadows NIXL's common/configuration.h
// because the shim directory comes first on the include path.
#ifndef NIXL_E2E_SHIM_COMMON_CONFIGURATION_H
#define NIXL_E2E_SHIM_COMMON_CONFIGURATION_H

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace nixl::config {

template<typename T>
[[nodiscard]] T
getValueDefaulted(const std::string &env, const T &fallback) {
    const char *v = std::getenv(env.c_str());
    if (v == nullptr) return fallback;
    if constexpr (std::is_same_v<T, std::string>) {
        return v;
    } else {
        std::istringstream in(v);
        T out{};
        if (!(in >> out) || !(in >> std::ws).eof())
            throw std::runtime_error("Config parameter '" + env + "': cannot parse '" + v + "'");
        return out;
    }
}

} // namespace nixl::config

#endif
