#!/usr/bin/env bash
# build-capi.sh builds libmooncake.so (the C ABI, capi/) into build/ (or
# $1), drops the header cgo generates (include/mooncake.h is the contract)
# and installs the library a second time, as a symbolic link, under the name
# Mooncake's consumers (NIXL, TensorRT-LLM) link against:
# libtransfer_engine.so.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build}
GO=${GO:-go}
mkdir -p "$out"
# The version script keeps the dynamic symbol table to the two public APIs.
CGO_ENABLED=1 $GO build -buildmode=c-shared -trimpath \
	-ldflags "-extldflags=-Wl,--version-script=$PWD/capi/exports.map" \
	-o "$out/libmooncake.so" ./capi
rm -f "$out/libmooncake.h"
# A link, not a copy: a process that loads both names (Python's package and
# a NIXL plugin, say) gets the same file, hence one Go runtime.
ln -sf libmooncake.so "$out/libtransfer_engine.so"
echo "built $out/libmooncake.so and $out/libtransfer_engine.so (headers: include/)"
