#!/usr/bin/env bash
# build-capi.sh builds the C ABI (capi/) into build/ (or $1): two files that
# are one library, installed side by side:
#
#   libmooncake.so     the public library: a small C library (capi/shim.c,
#                      capi/loader.c and generated forwarders) with the
#                      symbols of include/mooncake.h and transfer_engine_c.h;
#                      it starts no runtime when loaded, and loads the Go
#                      library at its first call that needs Go, so a host may
#                      fork before that call;
#   libmooncake_go.so  the Go library (-buildmode=c-shared), private.
#
# and links libtransfer_engine.so, the name Mooncake's consumers (NIXL,
# TensorRT-LLM) link against, to libmooncake.so. cgo's generated header is
# read to generate the forwarders and then dropped: include/*.h are the
# contract. The build fails when libmooncake.so does not define exactly the
# functions the public headers declare.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build}
GO=${GO:-go}
CC=${CC:-gcc}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The Go library exports its cgo exports and nothing else (see the map),
# and carries a GNU build ID, by which libmooncake.so recognises the Go
# library of its build: asked for, not left to the linker's default.
CGO_ENABLED=1 $GO build -buildmode=c-shared -trimpath \
	-ldflags "-extldflags=-Wl,--version-script=$PWD/capi/exports_go.map,--build-id=sha1" \
	-o "$tmp/libmooncake_go.so" ./capi

$GO build -o "$tmp/shimgen" ./capi/internal/shimgen
# The forwarders, and the build ID of this Go library, which libmooncake.so
# checks its Go library against.
"$tmp/shimgen" forward -o "$tmp/mcgo_forward.c" -go "$tmp/libmooncake_go.so" "$tmp/libmooncake_go.h"
# The public functions are the C files of capi/ that call the Go exports
# (they include _cgo_export.h, here the header of the forwarders): shim.c,
# and any other such file, whether or not the Go build compiles it too.
printf '#include "libmooncake_go.h"\n' >"$tmp/_cgo_export.h"
mapfile -t public < <(grep -l '^#include "_cgo_export.h"' capi/*.c)
# The version script keeps the dynamic symbol table to the two public APIs
# (the forwarders of mcgo* stay internal). The SONAME is what a program
# linked against either name records: without one, a consumer that links
# the file by its path (CMake's find_library, as TensorRT-LLM's
# MOONCAKE_ROOT build does) would record that absolute path.
$CC -std=gnu11 -O2 -g -fPIC -shared -pthread -Wall -Wextra -Werror \
	-Iinclude -Icapi -I"$tmp" \
	"${public[@]}" capi/loader.c "$tmp/mcgo_forward.c" \
	-Wl,-soname,libmooncake.so \
	-Wl,--version-script="$PWD/capi/exports.map" -Wl,--no-undefined -ldl \
	-o "$tmp/libmooncake.so"
"$tmp/shimgen" check -lib "$tmp/libmooncake.so" -go "$tmp/libmooncake_go.so" \
	-exports "$tmp/libmooncake_go.h" include/mooncake.h include/transfer_engine_c.h

# Installed by rename, not rewritten in place: a running process that has
# the old files mapped keeps them.
for f in libmooncake_go.so libmooncake.so; do
	cp "$tmp/$f" "$out/.$f.new"
	chmod 755 "$out/.$f.new"
	mv -f "$out/.$f.new" "$out/$f"
done
# A link, not a copy: a process that loads both names (Python's package and
# a NIXL plugin, say) gets the same file. (A copy of one build would still
# share the Go library, hence one Go runtime, but not the loader's state.)
ln -sf libmooncake.so "$out/libtransfer_engine.so"
echo "built $out/libmooncake.so (+ libmooncake_go.so beside it) and $out/libtransfer_engine.so (headers: include/)"
