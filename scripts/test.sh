#!/usr/bin/env bash
# Installs dependencies, builds (release preset) and runs the default test suite
# (everything except the `slow` label; the `mpi` label runs real mpirun jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release "$@"
