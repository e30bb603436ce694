#!/usr/bin/env bash
# ctest entry: trains a tiny GPT-2 and a small Llama, exports each with HF names, and has
# check_hf_export.py (PyTorch, HF conventions) reproduce loom's greedy samples; and as model
# directories, check_hf_dir.py builds the model from config.json alone.
# Exit 77 (skip) without python3-torch: scripts/setup.sh --oracle installs it.
set -euo pipefail
loom=$1
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "SKIP: python3-torch missing"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--set train.val_every=0 --set train.log_every=1000)
"$loom" train "${common[@]}" --set train.steps=30 --set checkpoint.dir="$dir/gpt" >/dev/null
"$loom" train "${common[@]}" --set model.preset=llama --set model.layers=2 --set model.d_model=64 \
  --set model.heads=4 --set model.kv_heads=2 --set model.ffn=128 --set model.vocab=256 --set model.ctx=64 \
  --set train.steps=30 --set checkpoint.dir="$dir/llama" >/dev/null
here=$(dirname "$0")
/usr/bin/python3 "$here/check_hf_dir.py" "$loom" "$dir/gpt" "The " 24
/usr/bin/python3 "$here/check_hf_dir.py" "$loom" "$dir/llama" "A fool " 24
for dtype in fp32 bf16; do
  /usr/bin/python3 "$here/check_hf_export.py" "$loom" "$dir/gpt" "The " 24 "$dtype"
  /usr/bin/python3 "$here/check_hf_export.py" "$loom" "$dir/llama" "A fool " 24 "$dtype"
done
