#!/usr/bin/env bash
# Runs every fuzz target of the network decoders for a while each.
# Usage: scripts/fuzz.sh [duration per target, default 30s]
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-30s}
for pkg in $(go list ./...); do
  for f in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "== $pkg $f ($t)"
    go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" "$pkg"
  done
done
