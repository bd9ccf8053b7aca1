#!/usr/bin/env bash
# Installs what the test suite needs beyond Go, Python and a C compiler:
#  - Debian libraries the official Mooncake wheel links against;
#  - redis-server, the Redis yardstick of the store benchmark (bench/store);
#  - cmake and GoogleTest, for the C++ SDK's suite (make cxx-test);
#  - iproute2 (ip), with which the network-fault tests build their hosts
#    (internal/netlab);
#  - the official wheel (mooncake-transfer-engine-non-cuda) in .venv-official,
#    used only by the cross-implementation tests.
# A step that cannot be done is reported; the tests that need it then skip
# with that reason (they never pass silently).
set -uo pipefail
cd "$(dirname "$0")/.."

need=(libcurl4 libibverbs1 rdma-core librdmacm1 libnuma1 liburing2 redis-server cmake libgtest-dev iproute2)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "test-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || echo "test-deps: apt-get failed; official-Mooncake interop tests and the Redis yardstick tests will skip (and, as root, the network-fault tests fail)"
fi

venv=.venv-official
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import mooncake.engine' 2>/dev/null; then
  echo "test-deps: installing mooncake-transfer-engine-non-cuda into $venv"
  python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check mooncake-transfer-engine-non-cuda \
    || echo "test-deps: pip install failed; official-Mooncake interop tests will skip"
fi
exit 0
