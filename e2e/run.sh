#!/usr/bin/env bash
# e2e/run.sh [FRAMEWORK...]: the real frameworks (their own code, unchanged)
# against this checkout's Python package, C library and `mooncake up`.
# Default: every suite (vllm vllm026 sglang lmcache nixl torch); E2E_PYTEST_ARGS adds
# pytest arguments. Each suite runs in its own cached venv (e2e/venv.sh) and
# prints its wall time; a failing suite fails the run after the others ran.
# E2E_PYTEST_ARGS is split as the shell would (quotes work).
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
if (($#)); then suites=("$@"); else suites=(vllm vllm026 sglang lmcache nixl torch); fi

set -e
$GO build -o bin/mooncake ./cmd/mooncake
bash scripts/build-capi.sh build >/dev/null
wheel=$(bash scripts/build-wheel.sh)
set +e

eval "pytest_args=(${E2E_PYTEST_ARGS:-})"
export MOONCAKE_BIN=$PWD/bin/mooncake MOONCAKE_LIB_DIR=$PWD/build
failed=()
summary=()
for s in "${suites[@]}"; do
  start=$SECONDS
  if ! py=$(bash e2e/venv.sh "$s" "$wheel"); then
    failed+=("$s (install)")
    summary+=("$s: install failed after $((SECONDS - start)) s")
    continue
  fi
  installed=$((SECONDS - start))
  echo "=== e2e $s ($py)"
  (cd e2e && "$py" -m pytest -p no:cacheprovider "${pytest_args[@]}" "$s")
  rc=$?
  ((rc == 0)) || failed+=("$s")
  summary+=("$s: tests $((SECONDS - start - installed)) s, venv $installed s, exit $rc")
done

echo "=== e2e summary"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "e2e: failed: ${failed[*]}"
  exit 1
fi
