#!/usr/bin/env bash
# The largest Llama-style model that trains for 3 steps on this machine, in memory against
# optimizer + parameter offload (issue 19; Notes [Optimizer offload], [Parameter offload]).
# Llama blocks of d_model 2048 (16 heads, ffn 5632 by Llama's rule, vocab 32000, untied
# head), seq 128, batch 1, fp32, 2 threads; LAYERS sets the size (131M + 51.4M per layer).
# Prints each run's parameter count, its up-front refusal if any, step times and the
# memory report (peak resident per category, offload traffic).
# Usage: bench/offload_scale.sh LAYERS_IN_MEMORY LAYERS_OFFLOADED [offload_dir]   (LAYERS_IN_MEMORY 0: skip those)
set -euo pipefail
cd "$(dirname "$0")/.."
mem_layers=${1:-26}
off_layers=${2:-83}
dir=${3:-/var/tmp}
loom=./build/release/loom
model=(--set model.arch=llama --set model.d_model=2048 --set model.heads=16 --set model.kv_heads=16
       --set model.ffn=5632 --set model.vocab=32000 --set model.ctx=128 --set train.seq=128 --set train.batch=1
       --set train.steps=3 --set train.val_every=0 --set train.val_batches=1 --set train.log_every=1
       --set checkpoint.dir= --set train.threads=2)
run() {  # name, layers, extra sets...
  local name=$1 layers=$2
  shift 2
  echo "== $name: $layers layers"
  /usr/bin/time -f "   wall %e s, max RSS %M KiB" $loom train "${model[@]}" --set "model.layers=$layers" "$@" 2>&1 |
    grep -E "loom train:|step [0-9]+/|memory \(|error|wall" || true
}
if [ "$mem_layers" -gt 0 ]; then  # 0: only the offloaded run
  run in-memory "$mem_layers"
  run in-memory-one-more "$((mem_layers + 1))"
fi
run offloaded "$off_layers" --set offload.optimizer=disk --set offload.params=disk --set "offload.dir=$dir"
