#!/usr/bin/env bash
# connectors/nixl/build.sh: builds the MOONCAKE_STORE NIXL backend plugin
# (Mooncake Store as NIXL object storage) against this checkout's C library.
#
# Inputs:
#   NIXL_SRC          a NIXL source tree for its plugin API headers (default:
#                     ../shared/reference/nixl beside the checkout, the subset
#                     of NIXL e2e/nixl builds from; see e2e/nixl/README.md)
#   MOONCAKE_LIB_DIR  where libmooncake.so is (default: build/)
#   OUT               output folder (default: build/nixl-store)
# Output: OUT/plugins/libplugin_MOONCAKE_STORE.so, the file NIXL's loader
# opens for backends=["MOONCAKE_STORE"] with NIXL_PLUGIN_DIR=OUT/plugins.
# Prints OUT. Rebuilds only when an input is newer than the plugin.
#
# NIXL's headers pull in abseil logging; e2e/nixl/shim serves stand-ins, so
# g++ is all the build needs. The backend base classes are header-inline:
# the plugin links nothing of NIXL, only libmooncake.so (--no-undefined).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=${NIXL_SRC:-$root/../shared/reference/nixl}
lib=${MOONCAKE_LIB_DIR:-$root/build}
out=${OUT:-$root/build/nixl-store}
CXX=${CXX:-g++}

die() { echo "connectors/nixl/build.sh: $*" >&2; exit 1; }
[ -f "$src/src/api/cpp/backend/backend_plugin.h" ] ||
  die "no NIXL headers at $src (set NIXL_SRC to a NIXL checkout)"
[ -f "$lib/libmooncake.so" ] || die "no $lib/libmooncake.so (run scripts/build-capi.sh)"
src=$(cd "$src" && pwd)
lib=$(cd "$lib" && pwd)

plugin=$out/plugins/libplugin_MOONCAKE_STORE.so
sources=("$here/store_backend.cpp" "$here/store_plugin.cpp")
mkdir -p "$out/plugins"
if [ ! -e "$plugin" ] || [ -n "$(find "${sources[@]}" "$here/store_backend.h" "$here/build.sh" \
  "$root/e2e/nixl/shim" "$root/include/mooncake.h" "$src/src/api" "$src/src/utils" \
  -newer "$plugin" -print -quit)" ]; then
  echo "connectors/nixl/build.sh: building $plugin" >&2
  "$CXX" -std=c++20 -O2 -g0 -fPIC -shared -pthread -Wall -Wextra -Wno-unused-parameter \
    -I"$root/e2e/nixl/shim" -I"$root/include" -I"$src/src/api/cpp" -I"$src/src/core/telemetry" \
    -I"$src/src/utils" -I"$src/src/infra" "${sources[@]}" -L"$lib" -lmooncake \
    -Wl,-rpath,"$lib" -Wl,--no-undefined -o "$plugin.tmp"
  mv "$plugin.tmp" "$plugin"
fi
echo "$out"
