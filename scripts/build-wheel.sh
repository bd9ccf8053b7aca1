#!/usr/bin/env bash
# build-wheel.sh [PYTHON]: builds the mooncake-go wheel into build/py-wheel
# (setup.py compiles libmooncake.so from capi/ and the mooncake command from
# cmd/mooncake with the local Go toolchain and bundles both; the command is
# what the official console scripts, mooncake_master & co., run) and prints
# the wheel's path. The Python suite and the framework
# suites (e2e/) install this one file.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-${PYTHON:-python3}}
wheels=build/py-wheel
# python/build is setuptools' staging folder: a file deleted from the
# source would otherwise live on in the wheel.
rm -rf "$wheels" python/build
"$py" -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheels" ./python >&2
whl=$(ls "$wheels"/mooncake_go-*.whl)
case "$whl" in
  *-py3-none-linux_*.whl) ;;
  *) echo "build-wheel: $whl is not a py3-none-<platform> wheel" >&2; exit 1 ;;
esac
echo "$PWD/$whl"
