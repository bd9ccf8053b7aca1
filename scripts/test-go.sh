#!/usr/bin/env bash
# Runs the Go tests with the race detector (make unit): the packages given,
# or all. When they fail, the tests that failed, raced or hung are named
# again at the end, where a CI log's tail shows them: a package that times
# out prints the tests it was running first, then every goroutine's stack.
# GO_TEST_TIMEOUT bounds each package (20m).
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
${GO:-go} test -race -count=1 -timeout "${GO_TEST_TIMEOUT:-20m}" "${@:-./...}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
	echo "=== Go tests failed (exit $rc); again, what failed:"
	# The failed tests and packages; a race's report; a timeout's panic
	# and the tests it names (tab-indented lines after "running tests:").
	awk '/^(--- FAIL|FAIL|WARNING: DATA RACE|panic: )/ { print; next }
	     /^[ \t]+--- FAIL/ { print; next }
	     /^[ \t]*running tests:/ { print; running = 1; next }
	     running && /^\t\t/ { print; next }
	     { running = 0 }' "$log"
fi
exit "$rc"
