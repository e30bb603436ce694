#!/usr/bin/env bash
# Installs dependencies, builds, and runs the default training job (tiny GPT on the
# fortunes corpus), then samples from the checkpoint it saved.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target loom
./build/release/loom train "$@"
./build/release/loom sample --checkpoint runs/default --prompt "The " --tokens 200 --temperature 0.8
