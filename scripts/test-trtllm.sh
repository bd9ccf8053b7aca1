#!/usr/bin/env bash
# test-trtllm.sh checks the C/C++ SDK as its users get it: it installs the
# tree (scripts/install.sh) into a temporary prefix, MOVES it (the tree
# must be relocatable), and then
#   - checks that no installed file names the build or the first prefix,
#     that the libraries carry no RPATH and the SONAME libmooncake.so;
#   - builds a tiny C program with nothing but `pkg-config --cflags --libs`
#     of mooncake.pc and of transfer_engine.pc, and runs it;
#   - configures connectors/trtllm/test with find_package(mooncake CONFIG)
#     against the moved tree, builds the GoogleTest suite and a program
#     linked as TensorRT-LLM links its Mooncake wrapper (find_library under
#     MOONCAKE_ROOT) and one linked as NIXL's meson build links its plugin
#     (the library's full path), checks they recorded no path, and runs
#     them with the tree moved once more;
#   - runs the suite, with a store (`mooncake up`) for its store tests.
# Arguments go to the suite (e.g. --gtest_filter='*AgentTest*'). BENCH=1
# runs connectors/trtllm/test/bench.cpp instead of the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
GO=${GO:-go}
CC=${CC:-gcc}
tmp=$(mktemp -d)
up=
cleanup() {
	if [ -n "$up" ]; then
		kill "$up" 2>/dev/null || true
		wait "$up" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "test-trtllm: $*" >&2; exit 1; }

bash scripts/install.sh "$tmp/stage"
mv "$tmp/stage" "$tmp/sdk"
sdk=$tmp/sdk

# Relocatable: nothing installed names where it was built or first put.
for f in lib/libmooncake.so lib/libmooncake_go.so lib/libtransfer_engine.so include/mooncake.h \
	include/transfer_engine_c.h include/mooncake.hpp lib/cmake/mooncake/mooncake-config.cmake \
	lib/cmake/mooncake/mooncake-config-version.cmake lib/pkgconfig/mooncake.pc lib/pkgconfig/transfer_engine.pc; do
	[ -e "$sdk/$f" ] || fail "not installed: $f"
done
[ "$(readlink "$sdk/lib/libtransfer_engine.so")" = libmooncake.so ] || fail "libtransfer_engine.so is not a relative link to libmooncake.so"
if grep -rl -e "$tmp/stage" -e "$root" "$sdk/include" "$sdk/lib/cmake" "$sdk/lib/pkgconfig"; then
	fail "installed files above name a build path"
fi
for lib in libmooncake.so libmooncake_go.so; do
	if readelf -d "$sdk/lib/$lib" | grep -E 'RPATH|RUNPATH'; then fail "$lib has an RPATH"; fi
done
readelf -d "$sdk/lib/libmooncake.so" | grep -q 'SONAME.*\[libmooncake.so\]' || fail "libmooncake.so has no SONAME libmooncake.so"

# pkg-config, from the moved tree.
export PKG_CONFIG_PATH=$sdk/lib/pkgconfig
want=$(awk '$2 == "MC_ABI_VERSION_MAJOR" { M = $3 } $2 == "MC_ABI_VERSION_MINOR" { m = $3 } END { print M "." m }' include/mooncake.h)
for pc in mooncake transfer_engine; do
	[ "$(pkg-config --modversion $pc)" = "$want" ] || fail "$pc.pc: version $(pkg-config --modversion $pc), want $want"
	# shellcheck disable=SC2046 # pkg-config's flags are words
	$CC -std=c11 -Wall -Wextra -Werror connectors/trtllm/test/pkgconfig_link.c $(pkg-config --cflags --libs $pc) \
		-o "$tmp/pkgconfig_link_$pc"
	LD_LIBRARY_PATH=$sdk/lib "$tmp/pkgconfig_link_$pc"
done

# The suite, through the installed CMake package.
cmake -S connectors/trtllm/test -B "$tmp/build" -DCMAKE_PREFIX_PATH="$sdk" -DMOONCAKE_ROOT="$sdk" \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo >"$tmp/cmake.log" || { cat "$tmp/cmake.log"; fail "cmake configure failed"; }
cmake --build "$tmp/build" -j "$(nproc)" >"$tmp/build.log" || { cat "$tmp/build.log"; fail "build failed"; }

# Consumers linked the ways Mooncake's are: TensorRT-LLM's CMake
# (find_library under MOONCAKE_ROOT, above) and NIXL's meson
# (find_library('transfer_engine'), which hands the linker the file's full
# path: done here by hand, meson is not needed). Each must record a name,
# never a path into the tree, and run once the tree has moved again, found
# through the loader's search path.
${CXX:-g++} -std=c++17 -I"$sdk/include" connectors/trtllm/test/trtllm_style_link.cpp "$sdk/lib/libtransfer_engine.so" \
	-o "$tmp/build/nixl_style_link"
for prog in trtllm_style_link nixl_style_link; do
	needed=$(readelf -d "$tmp/build/$prog" | awk '/NEEDED/ { print $NF }' | tr '\n' ' ')
	case $needed in
	*/*) fail "$prog records a path: $needed" ;;
	*"[libmooncake.so]"*) ;;
	*) fail "$prog does not need libmooncake.so: $needed" ;;
	esac
done
mv "$sdk" "$tmp/sdk2"
for prog in trtllm_style_link nixl_style_link; do
	LD_LIBRARY_PATH=$tmp/sdk2/lib "$tmp/build/$prog" || fail "$prog failed with the tree moved"
done
mv "$tmp/sdk2" "$sdk"

# BENCH=1: the benchmark (bench.cpp) instead of the suite, its arguments
# from BENCH_ARGS, on each transport.
if [ -n "${BENCH:-}" ]; then
	for transport in auto tcp; do
		# shellcheck disable=SC2086 # BENCH_ARGS are words
		"$tmp/build/mooncake_cxx_bench" $transport ${BENCH_ARGS:-}
	done
	exit 0
fi

# A store for the store tests: embedded master and one storage node.
$GO build -o "$tmp/mooncake" ./cmd/mooncake
"$tmp/mooncake" up --no-ha --rpc_port 0 --metrics_port -1 --global_segment_size 64MiB >"$tmp/up.log" 2>&1 &
up=$!
for _ in $(seq 600); do
	grep -q '^ready' "$tmp/up.log" && break
	kill -0 "$up" 2>/dev/null || { cat "$tmp/up.log"; fail "mooncake up exited"; }
	sleep 0.1
done
master=$(awk '$1 == "clients" { print $3 }' "$tmp/up.log")
[ -n "$master" ] || { cat "$tmp/up.log"; fail "mooncake up printed no master"; }

MC_TEST_MASTER=$master "$tmp/build/mooncake_cxx_test" "$@"
