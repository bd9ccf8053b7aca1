#!/usr/bin/env bash
# e2e/py.sh SUITE SCRIPT [ARGS...]: runs a script with the Python of a
# framework suite's venv, set up as e2e/run.sh does it (this checkout's
# binary, C library and wheel; the cached venv), for the demo and the
# framework benchmarks: `make demo`, `make bench-vllm`.
set -euo pipefail
cd "$(dirname "$0")/.."
suite=$1
shift
GO=${GO:-go}
$GO build -o bin/mooncake ./cmd/mooncake
bash scripts/build-capi.sh build >/dev/null
wheel=$(bash scripts/build-wheel.sh)
py=$(bash e2e/venv.sh "$suite" "$wheel")
export MOONCAKE_BIN=$PWD/bin/mooncake MOONCAKE_LIB_DIR=$PWD/build
exec "$py" "$@"
