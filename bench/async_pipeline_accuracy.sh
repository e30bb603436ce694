#!/usr/bin/env bash
# Asynchronous pipelines against their exact peer (issue 17): the default job (tiny GPT on
# fortunes with the 2,048-piece vocabulary) as a pp-stage pipeline, one minibatch per step,
# trained with flushing 1F1B (the exact schedule; with the default clipping, and without it,
# as the asynchronous modes must run) and with each asynchronous schedule from the same seed;
# prints the validation curves and the final ratios to 1F1B without clipping.
# Usage: [SCHEDULES="pipedream pipemare"] [PP=2] bench/async_pipeline_accuracy.sh [steps] [val_every] [-- sets...]
# (parallel.sync_warmup_steps=W among the sets changes only the asynchronous runs: 1F1B always flushes)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
every=${2:-100}
shift 2 2>/dev/null || shift $# 2>/dev/null || true
[[ ${1:-} == -- ]] && shift
sets=("$@")
pp=${PP:-2}
loom=./build/release/loom
cache=$(scripts/default_data.sh)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
runs="1f1b-clip 1f1b ${SCHEDULES:-pipedream pipemare}"
for r in $runs; do
  sched=${r%-clip}
  clip=0; [[ $r == *-clip ]] && clip=1.0
  env -u OPENBLAS_CORETYPE $loom train --nproc "$pp" --pp "$pp" --schedule "$sched" --grad-accum 1 \
    --set model.preset=tiny --set model.vocab=2048 --set "data.shards=$cache/shards" --set "optim.grad_clip=$clip" \
    --set "train.steps=$steps" --set "train.val_every=$every" --set train.log_every=100 --set checkpoint.dir= \
    --set train.threads=1 ${sets[@]+"${sets[@]/#/--set=}"} --json >"$out/$r.jsonl" 2>"$out/$r.err" ||
    { cat "$out/$r.err"; exit 1; }
done
python3 - "$out" $runs <<'PY'
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
def curve(r):
    lines = [json.loads(l) for l in open(f"{out}/{r}.jsonl") if l.startswith("{")]
    return {l["step"]: l["val_loss"] for l in lines if "val_loss" in l}
c = {r: curve(r) for r in runs}
ref = c["1f1b"]
print(f"{'step':>6}" + "".join(f"{r:>11}" for r in runs) + "".join(f"{r + '/1f1b':>16}" for r in runs[2:]))
for s in sorted(ref):
    print(f"{s:>6}" + "".join(f"{c[r][s]:>11.4f}" for r in runs) + "".join(f"{c[r][s] / ref[s]:>16.4f}" for r in runs[2:]))
last = max(ref)
for r in runs[2:]:
    print(f"final: {r} / 1f1b (no clipping) validation loss {c[r][last] / ref[last]:.4f} "
          f"({100 * (c[r][last] / ref[last] - 1):+.2f}%); 1f1b with clipping {c['1f1b-clip'][last]:.4f}")
PY
bench/plot_runs.sh async_pipeline_accuracy "$out" val_loss,loss   # FIGURE=PATH.svg|png to choose where
