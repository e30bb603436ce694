#!/usr/bin/env bash
# Context parallelism's reach (issue 53): the longest sequence that trains under a fixed
# memory.limit_gib, cp 1 against cp 4 (config B: GPT-2's 50,257-token vocabulary, 6 layers of
# 384, 6 heads; one sequence a step). For each layout the longest train.seq, a multiple of
# GRAIN tokens, that the engine's memory check (memory.limit_gib, Note [Part memory
# estimates]) lets start is found by doubling and bisection: a refused size stops before step
# 1 naming memory.limit_gib; an accepted one is stopped once its header is printed. That
# size then trains STEPS steps, and the run's own report gives the peaks it measured
# (resident pages of each tracked buffer, held to the budget after every step) and the
# process's peak RSS; tokens/s per rank beside cp 1's.
#   bench/cp_reach.sh [limit_gib] [layout ...]     layout: cp=1 | cp=4,cp_mode=ring | ...
# Defaults: 1.5 GiB; cp=1, cp=4 with cp_mode=ring and allgather. GRAIN (512), STEPS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-1.5}
shift || true
layouts=("$@")
[[ ${#layouts[@]} -gt 0 ]] || layouts=(cp=1 cp=4,cp_mode=ring cp=4,cp_mode=allgather)
grain=${GRAIN:-512}
steps=${STEPS:-2}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--set model.preset=gpt2 --set model.layers=6 --set model.d_model=384 --set model.heads=6 --set model.ffn=1536)

# loom train for layout $1 at sequence $2 and $3 steps, output in $tmp/log.
train() {
  local layout=$1 seq=$2 n=$3 cp=1 args=()
  shift 3
  IFS=, read -ra kv <<< "$layout"
  for x in "${kv[@]}"; do
    args+=(--set "parallel.$x")
    [[ $x == cp=* ]] && cp=${x#cp=}
  done
  local launch=()
  [[ $cp -gt 1 ]] && launch=(--nproc "$cp")
  env -u OPENBLAS_CORETYPE build/release/loom train "${launch[@]}" "${model[@]}" "${args[@]}" --set "model.ctx=$seq" --set "train.seq=$seq" \
    --set train.batch=1 --set "train.steps=$n" --set train.val_every=0 --set train.val_batches=1 \
    --set checkpoint.dir= --set train.threads=1 --set "memory.limit_gib=$limit" "$@" > "$tmp/log" 2>&1
}

# 0: the engine lets layout $1 start at sequence $2 (its header printed), 1: refused by the
# memory check; anything else stops the script.
fits() {
  train "$1" "$2" 1 &
  local pid=$!
  while kill -0 "$pid" 2> /dev/null; do
    if grep -q "^loom train: " "$tmp/log" 2> /dev/null; then  # the header: past the memory check
      pkill -TERM -P "$pid" 2> /dev/null || true
      kill -TERM "$pid" 2> /dev/null || true
      wait "$pid" 2> /dev/null || true
      return 0
    fi
    sleep 0.2
  done
  if wait "$pid"; then return 0; fi
  grep -q "memory.limit_gib allows" "$tmp/log" && return 1
  echo "layout $1 at seq $2 failed otherwise:" >&2
  tail -5 "$tmp/log" >&2
  exit 2
}

longest() {  # the longest multiple of grain that fits, 0 if none
  local layout=$1 lo=0 hi=1
  while fits "$layout" $((hi * grain)); do lo=$hi hi=$((hi * 2)); done
  while ((hi - lo > 1)); do
    local mid=$(((lo + hi) / 2))
    if fits "$layout" $((mid * grain)); then lo=$mid; else hi=$mid; fi
  done
  echo $((lo * grain))
}

echo "reach under memory.limit_gib = $limit (config B, batch 1, sequences in steps of $grain tokens)"
base_seq=0 base_tps=0
for layout in "${layouts[@]}"; do
  seq=$(longest "$layout")
  if [[ $seq -eq 0 ]]; then
    echo "$layout: not even $grain tokens fit"
    continue
  fi
  cp=1
  [[ $layout =~ cp=([0-9]+) ]] && cp=${BASH_REMATCH[1]}
  train "$layout" "$seq" "$steps" || { tail -5 "$tmp/log"; exit 1; }
  tps=$(sed -n 's/^done: .*, \([0-9.]*\) tokens\/s.*/\1/p' "$tmp/log" | tail -1)
  mem=$(grep "^memory (rank 0" "$tmp/log" | sed 's/.*activations \([0-9.]*\).*at most \([0-9.]* [KMG]iB\) at once.*process peak RSS \([0-9.]* [KMG]iB\).*/activations \1 MiB, tracked peak \2, rank 0 peak RSS \3/')
  per_rank=$(awk -v t="$tps" -v c="$cp" 'BEGIN { printf "%.1f", t / c }')
  if [[ $base_seq -eq 0 ]]; then base_seq=$seq base_tps=$per_rank; fi
  awk -v l="$layout" -v s="$seq" -v b="$base_seq" -v t="$per_rank" -v bt="$base_tps" -v m="$mem" 'BEGIN {
    printf "%-22s longest seq %6d (%.2fx the first layout)  %8.1f tokens/s per rank (%.2fx)  %s\n", l, s, s / b, t, t / bt, m }'
done
