#!/usr/bin/env bash
# Python suite: builds the mooncake-go wheel (libmooncake.so compiled from
# capi/ with the local Go toolchain and bundled), installs it into a private
# venv (.venv-py) with pytest and numpy, and runs python/tests against a
# store cluster the tests start themselves (bin/mooncake up).
#
# Environment: PYTHON (interpreter for the venv, default python3),
# PYTEST_ARGS (extra pytest arguments). The cross-implementation tests use
# .venv-official from `make deps` and skip, saying why, without it. The
# store's GPU tests run on the CUDA driver test double, built here.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
GO=${GO:-go}
venv=.venv-py

$GO build -o bin/mooncake ./cmd/mooncake

if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check pytest numpy

whl=$(bash scripts/build-wheel.sh "$venv/bin/python")
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$whl"

# GPU memory for test_device_store.py: the CUDA driver test double, named
# for this suite only (its tests load it in child processes of their own).
bash engine/device/fakecuda/build.sh build/fakecuda
export MC_CUDA_DRIVER="$PWD/build/fakecuda/libfakecuda.so"

# Run from outside the source tree so that the installed package is tested.
cd python
exec "../$venv/bin/python" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests
