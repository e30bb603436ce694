#!/usr/bin/env bash
# Length bucketing (issue 15, Note [Length bucketing]) against its two alternatives on the
# fortunes corpus (one fortune per document, the default job's 2,048-piece vocabulary):
#   packed     - fixed windows of seq tokens across documents (data.bucketing off): no padding;
#   pad-to-seq - one document per row, every row padded to seq (buckets 1, pool 1);
#   bucketed   - one document per row, rows of similar length, padded to the bucket (defaults).
# Prints real (target) tokens/s, the share of computed positions that were padding, and the
# final validation loss (packed windows for all three). Usage: bench/bucketing.sh [steps] [seq] [batch]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-60}
seq=${2:-256}
batch=${3:-16}
loom=./build/release/loom
cache=$(scripts/default_data.sh)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--set model.preset=tiny --set model.vocab=2048 --set "data.shards=$cache/shards" --set "train.seq=$seq"
        --set "model.ctx=$seq" --set "train.steps=$steps" --set "train.batch=$batch" --set train.val_every=0
        --set train.log_every=1 --set checkpoint.dir= --json)
run() {  # name, extra sets...
  local name=$1
  shift
  $loom train "${common[@]}" "$@" >"$out/$name.jsonl" 2>"$out/$name.err"
}
run packed
run pad-to-seq --set data.bucketing=true --set data.buckets=1 --set data.bucket_pool=1
run bucketed --set data.bucketing=true
python3 - "$out" "$steps" "$seq" "$batch" <<'PY'
import json, sys
out, steps, seq, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"tiny GPT, vocab 2048, seq {seq}, batch {batch} rows, {steps} steps; tokens/s after the first 5 steps")
print(f"{'mode':<12}{'real tok/s':>12}{'padding':>10}{'real tokens':>13}{'val_loss':>10}")
rows = {}
for name in ("packed", "pad-to-seq", "bucketed"):
    lines = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.startswith("{")]
    st = [l for l in lines if "loss" in l and "val_loss" not in l]
    val = [l["val_loss"] for l in lines if "val_loss" in l][-1]
    later = st[5:]
    secs = later[-1]["elapsed_s"] - st[4]["elapsed_s"]
    # tokens_per_s is per logging window (one step here): weight by step time.
    tok = sum(l["tokens_per_s"] * (b["elapsed_s"] - a["elapsed_s"]) for a, b, l in zip(st[4:], later, later))
    pad = sum(l.get("padding", 0.0) for l in st) / len(st)
    rows[name] = tok / secs
    print(f"{name:<12}{tok / secs:>12.0f}{100 * pad:>9.1f}%{tok:>13.0f}{val:>10.4f}")
print(f"bucketed / pad-to-seq real tokens/s: {rows['bucketed'] / rows['pad-to-seq']:.2f}x; "
      f"bucketed / packed: {rows['bucketed'] / rows['packed']:.2f}x")
PY
