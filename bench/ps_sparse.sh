#!/usr/bin/env bash
# Sparse-embedding parameter servers against dense PS and all-reduce DP (issue 18; Note
# [Sparse embeddings] in src/loom/modes/ps/ps_sparse.h). Config B's shape as a Llama (an
# untied 50,257-row embedding: GPT's tied table has a dense gradient), T 256, global batch 8,
# on the fortunes tokenized with an 8,192-piece SentencePiece vocabulary (made once under
# runs/data/fortunes-sp8192; the table keeps 50,257 rows, so a batch reads its few hundred
# distinct rows out of a 50k table, as GPT-2 text does). W workers and S servers as MPI ranks
# on this machine, or with NETNS=1 across the two shaped namespace "hosts" of
# scripts/netns_two_hosts.sh (already up): the workers on one, the servers on the other, and
# the all-reduce run one rank a host (W = S, even). The same seed; prints each mode's bytes
# per step from worker 0's report and its tokens/s.
# Usage: [W=2] [S=2] [NETNS=1] bench/ps_sparse.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
W=${W:-2} S=${S:-2}
loom=./build/release/loom
cache=runs/data/fortunes-sp8192
mkdir -p "$cache"
[[ -f "$cache/tokenizer.model" ]] || $loom tokenizer train --vocab 8192 --out "$cache/tokenizer.model" >&2
[[ -f "$cache/shards/prepare.json" ]] ||
  $loom data prepare --tokenizer "$cache/tokenizer.model" --in /usr/share/games/fortunes --out "$cache/shards" \
    --doc-separator % --overwrite >&2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=(model.preset=gpt2 model.arch=llama model.layers=6 model.d_model=384 model.heads=6 model.kv_heads=6 model.ffn=1024
   model.ctx=256 model.vocab=50257 train.batch=8 "data.shards=$cache/shards" "train.steps=$steps" train.val_every=0
   train.val_batches=2 checkpoint.dir= train.threads=1 train.log_every=1)
run() {  # name ranks sets...
  local name=$1 n=$2
  shift 2
  local launch=(--nproc "$n") pre=()
  if [[ -n ${NETNS:-} ]]; then launch=() pre=(scripts/netns_two_hosts.sh run $((n / 2)) --); fi
  env -u OPENBLAS_CORETYPE ${pre[@]+"${pre[@]}"} $loom train ${launch[@]+"${launch[@]}"} --dp "$W" ${B[@]/#/--set=} "$@" \
    >"$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; exit 1; }
}
run dense $((W + S)) --set "parallel.ps_servers=$S"
run sparse $((W + S)) --set "parallel.ps_servers=$S" --set ps.sparse_embedding=true
run allreduce "$W"
python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
rows = {}
for m in ["dense", "sparse", "allreduce"]:
    text = open(f"{out}/{m}.log").read()
    tok = float(re.search(r"done: final val_loss ([0-9.]+) nats.*?([0-9]+) tokens/s", text).group(2))
    val = float(re.search(r"done: final val_loss ([0-9.]+)", text).group(1))
    b = re.search(r"sent \+ received ([0-9.]+) MB per step, the embedding table's ([0-9.]+) MB", text)
    rows[m] = (tok, val, b and float(b.group(1)), b and float(b.group(2)))
    print(f"{m:>9}: {tok:8.0f} tokens/s, final val loss {val:.4f}" +
          (f", worker 0 sent + received {rows[m][2]:.2f} MB per step, embedding table {rows[m][3]:.3f} MB" if b else ""))
d, s = rows["dense"], rows["sparse"]
print(f"embedding bytes per step: dense / sparse = {d[3] / s[3]:.1f}x fewer; all bytes {d[2] / s[2]:.2f}x fewer; "
      f"tokens/s sparse / dense = {s[0] / d[0]:.2f}x, sparse / all-reduce = {s[0] / rows['allreduce'][0]:.2f}x")
PY
