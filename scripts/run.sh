#!/usr/bin/env bash
# Installs dependencies, builds, and runs the default training job (tiny GPT on the
# fortunes corpus with a learned 2,048-piece SentencePiece vocabulary), then samples from the
# checkpoint it saved. The vocabulary and the token shards are made once and cached in
# runs/data/fortunes-sp2048/. Passing data.path=... or data.shards=... trains on that instead
# (data.path: bytes, as `loom train` does by default).
#
# Each invocation is a fresh run in its own directory, runs/run-<UTC time>, so running the
# script again repeats the job instead of being refused by (or continuing) the last run;
# a `checkpoint.dir=...` among the arguments is used instead. To continue a run:
#   build/release/loom train --set checkpoint.dir=runs/run-... --resume auto --set train.steps=800
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target loom
dir=""
for a in "$@"; do
  [[ "$a" == checkpoint.dir=* ]] && dir="${a#checkpoint.dir=}"
done
extra=()
if [[ -z "$dir" ]]; then
  dir="runs/run-$(date -u +%Y%m%dT%H%M%SZ)-$$"
  extra=(--set "checkpoint.dir=$dir")
fi
own_data=0
for a in "$@"; do
  [[ "$a" == data.path=* || "$a" == data.shards=* ]] && own_data=1
done
if ((own_data == 0)); then
  cache=$(scripts/default_data.sh)
  extra+=(--set model.preset=tiny --set model.vocab=2048 --set "data.shards=$cache/shards"
          --set "data.tokenizer=$cache/tokenizer.model")
fi
./build/release/loom train "${extra[@]}" "$@"
./build/release/loom sample --checkpoint "$dir" --prompt "The " --tokens 200 --temperature 0.8
