// absl::InitializeLog for NIXL's headers: the logging stand-in (log.h) needs
// no initialisation, so this does nothing. Written for this harness.
#ifndef NIXL_E2E_SHIM_ABSL_LOG_INITIALIZE_H
#define NIXL_E2E_SHIM_ABSL_LOG_INITIALIZE_H

namespace absl {
inline void
InitializeLog() {}
} // namespace absl

#endif
