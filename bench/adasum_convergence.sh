#!/usr/bin/env bash
# Adasum against averaging (issue 16): the default job's model (tiny GPT, fortunes, 2,048
# pieces) at dp 4 with a 4x larger global batch (64 sequences), the same learning rate and
# seed, gradients combined by their mean or by Adasum (Note [Adasum]). Prints both
# validation curves and, for a few target losses, the first validation step that reaches
# each. Ranks run as 4 processes on this machine (--nproc 4).
# usage: bench/adasum_convergence.sh [STEPS] [VAL_EVERY]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300} every=${2:-25}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cache=$(scripts/default_data.sh)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for reduce in mean adasum; do
  env -u OPENBLAS_CORETYPE build/release/loom train --nproc 4 --dp 4 --json --set model.preset=tiny \
    --set model.vocab=2048 --set "data.shards=$cache/shards" --set train.batch=64 --set train.threads=1 \
    --set "train.steps=$steps" --set "train.val_every=$every" --set train.log_every=50 --set checkpoint.dir= \
    --set "parallel.reduce=$reduce" >"$tmp/$reduce.jsonl" 2>"$tmp/$reduce.err" || { tail -5 "$tmp/$reduce.err"; exit 1; }
done
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
curve = {m: {r["step"]: r["val_loss"] for r in map(json.loads, (l for l in open(f"{tmp}/{m}.jsonl") if l.startswith("{")))
             if "val_loss" in r} for m in ("mean", "adasum")}
print("dp 4, global batch 64, same lr and seed: validation loss")
print(f"{'step':>6}{'mean':>10}{'adasum':>10}")
for s in sorted(curve["mean"]):
    print(f"{s:>6}{curve['mean'][s]:>10.4f}{curve['adasum'].get(s, float('nan')):>10.4f}")
final = curve["mean"][max(curve["mean"])]
for target in sorted({round(final * f, 3) for f in (1.2, 1.1, 1.05, 1.0)}, reverse=True):
    first = {m: next((s for s in sorted(c) if c[s] <= target), None) for m, c in curve.items()}
    print(f"val loss <= {target:.3f}: mean at step {first['mean']}, adasum at step {first['adasum']}")
PY
bench/plot_runs.sh adasum_convergence "$tmp" val_loss,loss   # FIGURE=PATH.svg|png to choose where
