#!/usr/bin/env bash
# bf16 against its exact reference (issue 14): the default job (tiny GPT on fortunes with the
# 2,048-piece vocabulary) trained in fp32 and in bf16 from the same seed; prints both
# validation curves and the final ratio. Usage: bench/bf16_convergence.sh [steps] [val_every]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
every=${2:-100}
loom=./build/release/loom
cache=$(scripts/default_data.sh)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for p in fp32 bf16; do
  env -u OPENBLAS_CORETYPE $loom train --set model.preset=tiny --set model.vocab=2048 --set "data.shards=$cache/shards" \
    --set "train.steps=$steps" --set "train.val_every=$every" --set train.log_every=100 --set checkpoint.dir= \
    --precision "$p" --json >"$out/$p.jsonl" 2>/dev/null
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def curve(p):
    lines = [json.loads(l) for l in open(f"{out}/{p}.jsonl") if l.startswith("{")]
    val = {l["step"]: l["val_loss"] for l in lines if "val_loss" in l}
    tok = [l["tokens_per_s"] for l in lines if "tokens_per_s" in l]
    return val, sum(tok) / len(tok)
f, ftok = curve("fp32")
b, btok = curve("bf16")
print(f"{'step':>6}{'fp32 val':>10}{'bf16 val':>10}{'bf16/fp32':>11}")
for s in sorted(f):
    print(f"{s:>6}{f[s]:>10.4f}{b[s]:>10.4f}{b[s] / f[s]:>11.4f}")
last = max(f)
print(f"final: bf16 / fp32 validation loss {b[last] / f[last]:.4f} ({100 * (b[last] / f[last] - 1):+.2f}%); "
      f"mean logged tokens/s fp32 {ftok:.0f}, bf16 {btok:.0f} ({btok / ftok:.2f}x)")
PY
