// CHECK and DCHECK for NIXL's headers (NIXL_ASSERT_ALWAYS, NIXL_ASSERT), on
// top of the logging stand-in in log.h: a failed check logs FATAL, with the
// condition and whatever is streamed after it, and aborts. DCHECK is off
// under NDEBUG, as in abseil. Written for this harness; not abseil.
#ifndef NIXL_E2E_SHIM_ABSL_LOG_CHECK_H
#define NIXL_E2E_SHIM_ABSL_LOG_CHECK_H

#include "absl/log/log.h"

#define CHECK(cond) \
    NIXL_E2E_SHIM_LOG_IF(::nixl_e2e_shim::Severity::FATAL, !(cond)) << "Check failed: " #cond " "

#ifdef NDEBUG
#define DCHECK(cond) NIXL_E2E_SHIM_LOG_IF(::nixl_e2e_shim::Severity::FATAL, false && !(cond))
#else
#define DCHECK(cond) CHECK(cond)
#endif

#endif
