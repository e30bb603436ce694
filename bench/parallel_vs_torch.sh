#!/usr/bin/env bash
# Parallel training on this machine, loom vs PyTorch, in one run (issue 4):
#   loom single process (2 threads) | loom dp2 and dp2 + ZeRO-1/2/3 (2 ranks x 1 thread)
#   PyTorch DDP and DDP + ZeroRedundancyOptimizer (gloo, 2 processes x 1 thread)
#   config A only: loom pp2 1F1B, 4 micro-batches | PyTorch Pipe, 2 stages x 4 micro-batches
# and, measured from loom's own output: the share of gradient all-reduce time hidden behind
# backward (dp2, default 25 MiB buckets), the 1F1B bubble at p=2, m=8 from a trace, and
# ZeRO-3 per-rank model-state memory at dp2. Tokens/s are global (all ranks), steady
# state (first 2 steps dropped). Needs scripts/setup.sh --oracle and a release build.
# PRECISION=bf16: loom train.precision = bf16 against torch.autocast bf16 (data-parallel rows;
# the pipeline rows are fp32 only and skipped).
# Usage: [PRECISION=bf16] bench/parallel_vs_torch.sh [steps] [configs...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}; shift || true
configs=${*:-A B}
loom=build/release/loom
tcmalloc=$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null || true)
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export PRECISION=${PRECISION:-fp32}
common=(checkpoint.dir= train.val_every=0 train.val_batches=1 train.log_every=1 "train.steps=$((steps + 2))"
        "train.precision=$PRECISION")

model_sets() {
  case $1 in
    A) echo "model.preset=tiny train.batch=16" ;;
    B) echo "model.preset=gpt2 model.layers=6 model.d_model=384 model.heads=6 model.ffn=1536 model.ctx=256 train.batch=8" ;;
  esac
}

# Steady-state global tokens/s from loom's --json step lines (first 2 steps dropped).
tok_s() {
  /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and "tokens_per_s" in l]
rows = rows[2:]
tokens = float(sys.argv[2])
print(round(len(rows) * tokens / sum(tokens / r["tokens_per_s"] for r in rows), 1))' "$1" "$2"
}

loom_run() {  # name cfg threads extra-args...
  local name=$1 cfg=$2 threads=$3; shift 3
  env -u OPENBLAS_CORETYPE "$loom" train --json "$@" --set $(model_sets "$cfg") "${common[@]}" "train.threads=$threads" \
    > "$tmp/$name.out" 2> "$tmp/$name.err"
}

echo "precision $PRECISION"
printf "%-4s %-22s %12s %s\n" cfg run tokens/s note
for c in $configs; do
  T=$([[ $c == A ]] && echo 128 || echo 256)
  B=$([[ $c == A ]] && echo 16 || echo 8)
  loom_run single "$c" 2
  loom_run dp2 "$c" 1 --nproc 2 --dp 2
  for z in 1 2 3; do loom_run "zero$z" "$c" 1 --nproc 2 --dp 2 --zero $z; done
  ddp=$(cd "$tmp" && env -u OPENBLAS_CORETYPE LD_PRELOAD="$tcmalloc" /usr/bin/python3 "$OLDPWD/bench/torch_parallel_peer.py" ddp "$c" "$steps" 2>/dev/null | tail -1)
  zr=$(cd "$tmp" && env -u OPENBLAS_CORETYPE LD_PRELOAD="$tcmalloc" /usr/bin/python3 "$OLDPWD/bench/torch_parallel_peer.py" zero1 "$c" "$steps" 2>/dev/null | tail -1)
  single=$(tok_s "$tmp/single.out" $((B * T)))
  dp2=$(tok_s "$tmp/dp2.out" $((B * T)))
  tddp=$(echo "$ddp" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')
  tzero=$(echo "$zr" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')
  hidden=$(grep -o "[0-9.]*% of it hidden behind backward" "$tmp/dp2.err" | cut -d% -f1)
  printf "%-4s %-22s %12s\n" "$c" "loom single (2 thr)" "$single"
  printf "%-4s %-22s %12s %s\n" "$c" "loom dp2" "$dp2" "$(/usr/bin/python3 -c "print('%.2fx DDP, %.2fx loom single; %s%% of all-reduce hidden' % ($dp2/$tddp, $dp2/$single, '$hidden'))")"
  for z in 1 2 3; do
    zt=$(tok_s "$tmp/zero$z.out" $((B * T)))
    printf "%-4s %-22s %12s %s\n" "$c" "loom dp2 zero$z" "$zt" "$(/usr/bin/python3 -c "print('%.2fx torch ZeRO-1' % ($zt/$tzero))")"
  done
  printf "%-4s %-22s %12s\n" "$c" "torch DDP" "$tddp"
  printf "%-4s %-22s %12s\n" "$c" "torch DDP+ZeRO-1" "$tzero"
  grep -h "^memory" "$tmp/zero3.err" | sed "s/^/$c   zero3 /"
  if [[ $c == A && $PRECISION == fp32 ]]; then
    loom_run pp2 A 1 --nproc 2 --pp 2 --grad-accum 4
    pp=$(tok_s "$tmp/pp2.out" $((B * T)))
    tp=$(cd "$tmp" && env -u OPENBLAS_CORETYPE LD_PRELOAD="$tcmalloc" /usr/bin/python3 "$OLDPWD/bench/torch_parallel_peer.py" pipe A "$steps" 2>/dev/null | tail -1 |
         /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')
    printf "%-4s %-22s %12s %s\n" A "loom pp2 1f1b m4" "$pp" "$(/usr/bin/python3 -c "print('%.2fx torch Pipe' % ($pp/$tp))")"
    printf "%-4s %-22s %12s\n" A "torch Pipe 2x4" "$tp"
    # Bubble at p=2, m=8: per rank and step, 1 - (time in schedule steps) / (step time).
    loom_run bubble A 1 --nproc 2 --pp 2 --grad-accum 8 --trace "$tmp/bubble.json"
    /usr/bin/python3 - "$tmp/bubble.json" <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
fr = []
for rank in sorted({e["pid"] for e in ev}):
    steps = sorted((e for e in ev if e["pid"] == rank and e["cat"] == "step"), key=lambda e: e["ts"])[2:]
    for s in steps:
        busy = sum(e["dur"] for e in ev if e["pid"] == rank and e["cat"] == "pipeline"
                   and e["ts"] >= s["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"])
        fr.append(1 - busy / s["dur"])
p, m = 2, 8
print("A    1f1b bubble p=2 m=8   measured %.1f%% vs (p-1)/(m+p-1) = %.1f%% (%d rank-steps)" % (
    100 * sum(fr) / len(fr), 100 * (p - 1) / (m + p - 1), len(fr)))
PY
  fi
done
