#!/usr/bin/env bash
# Installs dependencies, builds (release preset) and runs the default test suite
# (everything except the `slow` label; the `mpi` label runs real mpirun jobs; the `fuzz`
# label replays the fuzz corpora), then fuzzes each hostile-input reader briefly
# (LOOM_FUZZ_SECONDS per target, default 10; 0 skips; scripts/fuzz.sh for longer runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release "$@"
if [[ "${LOOM_FUZZ_SECONDS:-10}" != 0 ]]; then
  LOOM_FUZZ_SEED=${LOOM_FUZZ_SEED:-1} scripts/fuzz.sh "${LOOM_FUZZ_SECONDS:-10}"
fi
