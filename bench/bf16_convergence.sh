#!/usr/bin/env bash
# Reduced precision against its exact reference (issue 14): the default job (tiny GPT on
# fortunes with the 2,048-piece vocabulary) trained in fp32 and in each other precision from
# the same seed (fp16 with its default dynamic loss scaling); prints the validation curves,
# the final ratios to fp32 and, for fp16, the steps skipped for overflow.
# An entry "P+bf16m" trains precision P with AdamW's moments in bf16 (optim.moments = bf16,
# Note [bf16 optimizer moments]), e.g. PRECISIONS="fp32+bf16m bf16 bf16+bf16m".
# Usage: [PRECISIONS="bf16 fp16"] bench/bf16_convergence.sh [steps] [val_every]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
every=${2:-100}
loom=./build/release/loom
cache=$(scripts/default_data.sh)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
precisions="fp32 ${PRECISIONS:-bf16}"
for e in $precisions; do
  moments=fp32
  [[ $e == *+bf16m ]] && moments=bf16
  env -u OPENBLAS_CORETYPE $loom train --set model.preset=tiny --set model.vocab=2048 --set "data.shards=$cache/shards" \
    --set "train.steps=$steps" --set "train.val_every=$every" --set train.log_every=100 --set checkpoint.dir= \
    --set "optim.moments=$moments" --precision "${e%%+*}" --json >"$out/$e.jsonl" 2>/dev/null
done
python3 - "$out" $precisions <<'PY'
import json, sys
out, precs = sys.argv[1], sys.argv[2:]
def curve(p):
    lines = [json.loads(l) for l in open(f"{out}/{p}.jsonl") if l.startswith("{")]
    val = {l["step"]: l["val_loss"] for l in lines if "val_loss" in l}
    tok = [l["tokens_per_s"] for l in lines if "tokens_per_s" in l and not l.get("skipped")]
    skipped = [l["step"] for l in lines if l.get("skipped")]
    return val, sum(tok) / len(tok), skipped
runs = {p: curve(p) for p in precs}
f = runs["fp32"][0]
print(f"{'step':>6}" + "".join(f"{p + ' val':>11}" for p in precs) + "".join(f"{p + '/fp32':>11}" for p in precs[1:]))
for s in sorted(f):
    print(f"{s:>6}" + "".join(f"{runs[p][0][s]:>11.4f}" for p in precs) +
          "".join(f"{runs[p][0][s] / f[s]:>11.4f}" for p in precs[1:]))
last = max(f)
for p in precs[1:]:
    v, tok, skipped = runs[p]
    print(f"final: {p} / fp32 validation loss {v[last] / f[last]:.4f} ({100 * (v[last] / f[last] - 1):+.2f}%); "
          f"mean logged tokens/s fp32 {runs['fp32'][1]:.0f}, {p} {tok:.0f} ({tok / runs['fp32'][1]:.2f}x)"
          + (f"; skipped steps {skipped}" if p == "fp16" else ""))
PY
bench/plot_runs.sh bf16_convergence "$out" val_loss,loss   # FIGURE=PATH.svg|png to choose where
