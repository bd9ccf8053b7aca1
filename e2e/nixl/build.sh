#!/usr/bin/env bash
# e2e/nixl/build.sh PYTHON: builds NIXL's own Mooncake backend plugin and its
# own unit test, unchanged, against this checkout's C library.
#
# Inputs:
#   PYTHON            a python whose site-packages hold the nixl-cu12 wheel
#                     (its libnixl and libserdes are linked into the test)
#   NIXL_SRC          a NIXL source tree (default: ../shared/reference/nixl
#                     beside the checkout, a subset of NIXL kept as test
#                     input; see its SNAPSHOT.md)
#   MOONCAKE_LIB_DIR  where libtransfer_engine.so is (default: build/)
#   NIXL_BUILD_DIR    output (default: build/e2e-nixl)
# Outputs, in NIXL_BUILD_DIR:
#   plugins/libplugin_MOONCAKE.so  the plugin, under the name NIXL's plugin
#                     loader looks for with backends=["MOONCAKE"] and
#                     NIXL_PLUGIN_DIR=plugins/
#   mooncake_backend_test          NIXL's test/unit/plugins/mooncake test
#
# The wheel ships no C++ headers, so the headers come from NIXL_SRC; the
# abseil logging and NIXL configuration headers they pull in are served by
# our stand-ins in e2e/nixl/shim, first on the include path. Each output is
# rebuilt only when one of its inputs is newer. Never writes into NIXL_SRC.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${1:?usage: e2e/nixl/build.sh PYTHON}
src=${NIXL_SRC:-$root/../shared/reference/nixl}
lib=${MOONCAKE_LIB_DIR:-$root/build}
out=${NIXL_BUILD_DIR:-$root/build/e2e-nixl}
CXX=${CXX:-g++}

die() { echo "e2e/nixl/build.sh: $*" >&2; exit 1; }
[ -f "$src/src/plugins/mooncake/mooncake_backend.cpp" ] ||
  die "no NIXL source at $src (set NIXL_SRC to a NIXL checkout)"
[ -f "$lib/libtransfer_engine.so" ] ||
  die "no $lib/libtransfer_engine.so (run scripts/build-capi.sh)"
src=$(cd "$src" && pwd)
lib=$(cd "$lib" && pwd)

# The wheel keeps libnixl.so and its siblings in a folder of its own; the
# folder's own dependencies sit in nixl_cu12.libs, which the linker needs
# to see (rpath-link) to check libnixl's needs.
nixl_lib=$("$py" - <<'EOF'
import importlib.metadata as md
for f in md.files("nixl-cu12") or []:
    if f.name == "libnixl.so":
        print(f.locate().resolve().parent)
        break
EOF
)
[ -n "$nixl_lib" ] && [ -f "$nixl_lib/libserdes.so" ] ||
  die "no libnixl.so/libserdes.so in the nixl-cu12 wheel of $py"
nixl_deps=$(cd "$nixl_lib/../nixl_cu12.libs" 2>/dev/null && pwd || echo "$nixl_lib")

mkdir -p "$out/plugins"
inc=(-I"$here/shim" -I"$root/include" -I"$src/src/api/cpp" -I"$src/src/core/telemetry"
  -I"$src/src/utils" -I"$src/src/infra" -I"$src/src/plugins/mooncake")
# NDEBUG stays undefined: NIXL's unit test checks everything with assert().
flags=(-std=c++20 -O1 -g0 -fPIC -UNDEBUG "${inc[@]}")

# stale OUT INPUT...: true when OUT is missing or older than an input (the
# headers, ours and NIXL's, count as inputs of both outputs).
stale() {
  local o=$1; shift
  [ -e "$o" ] || return 0
  [ -n "$(find "$@" "$here/shim" "$root/include/transfer_engine_c.h" "$src/src/api" \
    "$src/src/utils" "$src/src/infra" "$here/build.sh" -newer "$o" -print -quit)" ]
}

plugin=$out/plugins/libplugin_MOONCAKE.so
psrc=("$src/src/plugins/mooncake/mooncake_backend.cpp" "$src/src/plugins/mooncake/mooncake_plugin.cpp")
if stale "$plugin" "${psrc[@]}" "$src/src/plugins/mooncake/mooncake_backend.h"; then
  echo "e2e/nixl/build.sh: building $plugin" >&2
  # --no-undefined: the plugin must need nothing but our library and libc++
  # (NIXL's backend base classes are header-inline).
  "$CXX" "${flags[@]}" -shared "${psrc[@]}" -L"$lib" -ltransfer_engine \
    -Wl,-rpath,"$lib" -Wl,--no-undefined -o "$plugin.tmp"
  mv "$plugin.tmp" "$plugin"
fi

test_bin=$out/mooncake_backend_test
tsrc=("$src/test/unit/plugins/mooncake/mooncake_backend_test.cpp" "$src/src/infra/nixl_descriptors.cpp")
if stale "$test_bin" "${tsrc[@]}" "$plugin"; then
  echo "e2e/nixl/build.sh: building $test_bin" >&2
  # nixl_descriptors.cpp: the wheel's libnixl lacks some of the descriptor
  # list instantiations the test uses. No CUDA: the test's DRAM cases only.
  "$CXX" "${flags[@]}" -UHAVE_CUDA "${tsrc[@]}" -L"$out/plugins" -lplugin_MOONCAKE \
    -L"$nixl_lib" -lnixl -lserdes -Wl,-rpath,"$out/plugins:$nixl_lib" \
    -Wl,-rpath-link,"$nixl_deps" -o "$test_bin.tmp"
  mv "$test_bin.tmp" "$test_bin"
fi
echo "$out"
