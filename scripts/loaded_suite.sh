#!/usr/bin/env bash
# The default test suite on a loaded machine, as CI's 2-core machines see it: BUSY processes
# (default: one per core) busy-loop beside `ctest --preset release -j2` on the built tree.
# Prints the wall time and the slowest tests; the busy loops end with the script, however it
# ends. Takes about 12 minutes on 2 cores (docs/log/benchmarks.md, session 70).
# usage: scripts/loaded_suite.sh [BUSY] [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
busy=${1:-$(nproc)}
shift || true
[[ -d build/release ]] || { echo "build/release is missing: run scripts/test.sh (or cmake --build --preset release) first" >&2; exit 2; }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for ((i = 0; i < busy; i++)); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
log=$(mktemp /tmp/loom-loaded-suite.XXXXXX)
start=$(date +%s)
rc=0
ctest --preset release -j2 "$@" >"$log" 2>&1 || rc=$?
echo "ctest -j2 beside $busy busy loops: rc $rc, $(($(date +%s) - start)) s wall (log: $log)"
grep -E "tests passed|tests failed" "$log" || true
echo "slowest:"
grep -E "Test +#" "$log" | awk '{print $(NF-1), $4}' | sort -g -r | head -10
exit $rc
