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
# The CUDA backend (issue 20) is off by default; where nvcc exists, compile it and run its
# test binary, whose device tests skip without a GPU and whose host-side ones (the GPU
# trainer's refusals) run.
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  PATH=$PATH:/usr/local/cuda/bin cmake --preset cuda >/dev/null
  cmake --build --preset cuda --target loom_cuda_kernels loom_cuda cuda_test
  build/cuda/tests/cuda_test --gtest_brief=1
fi
if [[ "${LOOM_FUZZ_SECONDS:-10}" != 0 ]]; then
  LOOM_FUZZ_SEED=${LOOM_FUZZ_SEED:-1} scripts/fuzz.sh "${LOOM_FUZZ_SECONDS:-10}"
fi
