#!/usr/bin/env bash
# install.sh PREFIX: installs the C and C++ SDK of mooncake-go into PREFIX,
# the tree Mooncake's native consumers build against (TensorRT-LLM's
# MOONCAKE_ROOT, NIXL's meson find_library('transfer_engine')):
#
#   lib/libmooncake.so         the library (include/mooncake.h and
#                              include/transfer_engine_c.h)
#   lib/libmooncake_go.so      its Go half, loaded from beside it at the
#                              first call (the two files are one library)
#   lib/libtransfer_engine.so  -> libmooncake.so, Mooncake's name for it
#   include/mooncake.h, include/transfer_engine_c.h
#   include/mooncake.hpp       the header-only C++17 API (connectors/trtllm)
#   lib/cmake/mooncake/        find_package(mooncake CONFIG): imported
#                              targets mooncake::mooncake and
#                              mooncake::transfer_engine
#   lib/pkgconfig/mooncake.pc, transfer_engine.pc
#
# The tree is relocatable: no file names the build directory or PREFIX
# itself (the CMake package and the .pc files find the prefix from where
# they lie, and libmooncake.so finds its Go half beside its own file), so it
# may be moved or packed as is. DESTDIR stages it (DESTDIR/PREFIX). The
# library is built afresh into a private directory (never build/, which
# other commands rebuild), so the two halves always come from one build.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/install.sh PREFIX}
case $prefix in /*) ;; *) prefix=$PWD/$prefix ;; esac
dest=${DESTDIR:-}$prefix

# The package version is the ABI version of the header it ships.
major=$(awk '$2 == "MC_ABI_VERSION_MAJOR" { print $3 }' include/mooncake.h)
minor=$(awk '$2 == "MC_ABI_VERSION_MINOR" { print $3 }' include/mooncake.h)
[ -n "$major" ] && [ -n "$minor" ] || { echo "install.sh: no MC_ABI_VERSION in include/mooncake.h" >&2; exit 1; }
version=$major.$minor

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bash scripts/build-capi.sh "$tmp/lib" >/dev/null

install -d "$dest/lib/cmake/mooncake" "$dest/lib/pkgconfig" "$dest/include"
# Installed by rename (as build-capi.sh does): a running process that has
# the old files mapped keeps them.
for f in libmooncake_go.so libmooncake.so; do
	install -m 755 "$tmp/lib/$f" "$dest/lib/.$f.new"
	mv -f "$dest/lib/.$f.new" "$dest/lib/$f"
done
# A relative link: one file under both names, wherever the tree goes.
ln -sfn libmooncake.so "$dest/lib/libtransfer_engine.so"
install -m 644 include/mooncake.h include/transfer_engine_c.h connectors/trtllm/include/mooncake.hpp "$dest/include/"

# CMake package. The prefix is three levels above this file
# (lib/cmake/mooncake). Consumers record the library's SONAME
# (libmooncake.so, under either target), never a path.
cat >"$dest/lib/cmake/mooncake/mooncake-config.cmake" <<'EOF'
# mooncake-config.cmake: find_package(mooncake CONFIG) for the mooncake-go
# SDK. Imported targets:
#   mooncake::mooncake         libmooncake.so; include/mooncake.h (C) and
#                              include/mooncake.hpp (C++17, header-only)
#   mooncake::transfer_engine  libtransfer_engine.so (the same library under
#                              Mooncake's name); include/transfer_engine_c.h
# Variables: mooncake_INCLUDE_DIR, mooncake_LIBRARY_DIR, mooncake_VERSION.
get_filename_component(_mooncake_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(mooncake_INCLUDE_DIR "${_mooncake_prefix}/include")
set(mooncake_LIBRARY_DIR "${_mooncake_prefix}/lib")

foreach(_mooncake_target mooncake transfer_engine)
  if(NOT TARGET mooncake::${_mooncake_target})
    add_library(mooncake::${_mooncake_target} SHARED IMPORTED)
    set_target_properties(mooncake::${_mooncake_target} PROPERTIES
      IMPORTED_LOCATION "${mooncake_LIBRARY_DIR}/lib${_mooncake_target}.so"
      IMPORTED_SONAME "libmooncake.so"
      INTERFACE_INCLUDE_DIRECTORIES "${mooncake_INCLUDE_DIR}")
  endif()
endforeach()
# The library starts no thread of its own until its first call, but the Go
# half it then loads does: consumers link with the thread library.
find_package(Threads REQUIRED)
set_property(TARGET mooncake::mooncake mooncake::transfer_engine APPEND PROPERTY
  INTERFACE_LINK_LIBRARIES Threads::Threads)
unset(_mooncake_target)
unset(_mooncake_prefix)
EOF

cat >"$dest/lib/cmake/mooncake/mooncake-config-version.cmake" <<EOF
# The package version is the C ABI version (MC_ABI_VERSION of mooncake.h):
# a minor release only adds, so any $major.x at or above the version asked
# for will do.
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION_MAJOR STREQUAL "$major" AND NOT PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
elseif(NOT DEFINED PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
else()
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
endif()
if(NOT CMAKE_SIZEOF_VOID_P STREQUAL "8")
  set(PACKAGE_VERSION "$version (64-bit)")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
EOF

# pkg-config: ${pcfiledir} is where the .pc file lies (pkg-config and
# pkgconf both define it), so the prefix moves with the tree.
for pc in mooncake:mooncake:"mooncake-go C ABI (mooncake.h, mooncake.hpp)" \
	transfer_engine:transfer_engine:"Mooncake Transfer Engine C API (transfer_engine_c.h), served by mooncake-go"; do
	IFS=: read -r file lib desc <<<"$pc"
	cat >"$dest/lib/pkgconfig/$file.pc" <<EOF
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: $file
Description: $desc
Version: $version
Libs: -L\${libdir} -l$lib
Libs.private: -lpthread
Cflags: -I\${includedir}
EOF
done
echo "installed mooncake-go $version into $dest"
