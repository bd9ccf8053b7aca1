#!/usr/bin/env bash
# test-capi.sh builds libmooncake.so and runs the C test suite (capi/tests)
# against it: the native API across two processes, the Mooncake C API in
# the call sequences of NIXL's plugin and TensorRT-LLM's agent, bad input,
# threads, the store API against a store started here (`mooncake up`), and
# fork (a process that has the library loaded forks before its first call,
# and after it), the store with GPU buffers on the CUDA driver test double.
# A C++ program linked against libtransfer_engine.so by name runs too.
# Exits non-zero on any failure. Arguments are test names to run (default:
# all). CAPI_OUT is where the library and the test programs go (default
# build/); with GOEXPERIMENT=cgocheck2 (`make capi-test` runs the suite so
# too, into build/cgocheck2) the Go library checks every write of a Go
# pointer into C memory.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
CC=${CC:-gcc}
CXX=${CXX:-g++}
out=${CAPI_OUT:-build}
bash scripts/build-capi.sh "$out"

cflags=(-O1 -g -Wall -Wextra -Werror -Iinclude -pthread)
ldflags=(-L"$out" -Wl,-rpath,"$PWD/$out")
$CC -std=gnu11 "${cflags[@]}" capi/tests/*.c "${ldflags[@]}" -lmooncake -ldl -o "$out/capi_test"
$CXX -std=c++17 "${cflags[@]}" capi/tests/cxx_link.cc "${ldflags[@]}" -ltransfer_engine -ldl -o "$out/capi_cxx_link" "$PWD/$out/libmooncake.so"

# A store for the store tests: embedded master and one storage node.
# The store needs no cgocheck2: built as it always is (and cached).
env -u GOEXPERIMENT $GO build -o "$out/mooncake" ./cmd/mooncake
tmp=$(mktemp -d)
"$out/mooncake" up --no-ha --rpc_port 0 --metrics_port -1 --global_segment_size 64MiB >"$tmp/up.log" 2>&1 &
up=$!
cleanup() {
	kill "$up" 2>/dev/null || true
	wait "$up" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 600); do
	grep -q '^ready' "$tmp/up.log" && break
	kill -0 "$up" 2>/dev/null || { cat "$tmp/up.log"; echo "mooncake up exited" >&2; exit 1; }
	sleep 0.1
done
master=$(awk '$1 == "clients" { print $3 }' "$tmp/up.log")
[ -n "$master" ] || { cat "$tmp/up.log"; echo "mooncake up printed no master" >&2; exit 1; }

# GPU memory for the store_device test: the CUDA driver test double, which
# the test loads as a framework loads libcuda (only the test program sees
# it; the store it talks to runs without).
bash engine/device/fakecuda/build.sh "$out"
MC_TEST_MASTER=$master MC_CUDA_DRIVER="$PWD/$out/libfakecuda.so" "$out/capi_test" "$@"
if [ $# -eq 0 ]; then
	# The Mooncake API sequences once more as TensorRT-LLM's CI runs them:
	# MC_FORCE_TCP=1, TCP even between processes on one host.
	MC_FORCE_TCP=1 MC_CUDA_DRIVER="$PWD/$out/libfakecuda.so" "$out/capi_test" nixl_sequence trtllm_sequence compat_cross_api engine_device
fi
"$out/capi_cxx_link" "$PWD/$out/libmooncake.so"
