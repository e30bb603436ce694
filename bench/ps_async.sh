#!/usr/bin/env bash
# Asynchronous and stale-synchronous parameter servers against their exact peer, sync (BSP)
# (issue 18; Note [Asynchronous parameter server] in src/loom/modes/ps/ps.h). The default job
# (tiny GPT on fortunes, 2,048-piece vocabulary) with W workers and S servers as MPI ranks on
# this machine, the same seed and the same number of pushes (W x steps) in every mode:
#   1. accuracy: sync, async and ssp (bound TAU) without a straggler; validation curves on
#      worker 0 and the final ratios to sync;
#   2. a straggler: worker W-1 slowed SLOW times (ps.slow_worker / ps.slow_factor); wall time
#      of the whole run in each mode and the throughput ratio to sync (every mode trains
#      the same pushes, so tokens/s ratio = sync's seconds / the mode's).
# Usage: [W=2] [S=1] [TAU=2] [SLOW=2] bench/ps_async.sh [steps] [val_every] [straggler_steps] [-- sets...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
every=${2:-100}
slow_steps=${3:-200}
shift 3 2>/dev/null || shift $# 2>/dev/null || true
[[ ${1:-} == -- ]] && shift
sets=("$@")
W=${W:-2} S=${S:-1} TAU=${TAU:-2} SLOW=${SLOW:-2}
loom=./build/release/loom
cache=$(scripts/default_data.sh)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
train() {  # name steps val_every mode extra-sets...
  local name=$1 n=$2 ev=$3 mode=$4
  shift 4
  env -u OPENBLAS_CORETYPE $loom train --nproc $((W + S)) --dp "$W" --set "parallel.ps_servers=$S" \
    --set "ps.mode=$mode" --set "ps.staleness=$TAU" \
    --set model.preset=tiny --set model.vocab=2048 --set "data.shards=$cache/shards" \
    --set "train.steps=$n" --set "train.val_every=$ev" --set train.log_every=1 --set checkpoint.dir= \
    --set train.threads=1 "$@" ${sets[@]+"${sets[@]/#/--set=}"} --json >"$out/$name.jsonl" 2>"$out/$name.err" ||
    { cat "$out/$name.err"; exit 1; }
}
for m in sync async ssp; do train "$m" "$steps" "$every" "$m"; done
for m in sync async ssp; do
  train "$m-slow" "$slow_steps" 0 "$m" --set "ps.slow_worker=$((W - 1))" --set "ps.slow_factor=$SLOW"
done
python3 - "$out" "$W" "$S" "$TAU" "$SLOW" <<'PY'
import json, sys
out, W, S, tau, slow = sys.argv[1], *sys.argv[2:]
def lines(r):
    return [json.loads(l) for l in open(f"{out}/{r}.jsonl") if l.startswith("{")]
modes = ["sync", "async", "ssp"]
val = {m: [(l["step"], l["val_loss"]) for l in lines(m) if "val_loss" in l] for m in modes}
print(f"accuracy: {W} workers, {S} servers, ssp bound {tau}; validation loss on worker 0 by its own step")
print(f"{'#':>4}" + "".join(f"{m + ' step':>12}{m:>9}" for m in modes))
for i in range(max(len(v) for v in val.values())):
    row = f"{i:>4}"
    for m in modes:
        row += f"{val[m][i][0]:>12}{val[m][i][1]:>9.4f}" if i < len(val[m]) else " " * 21
    print(row)
ref = val["sync"][-1][1]
for m in modes[1:]:
    v = val[m][-1][1]
    print(f"final: {m} / sync validation loss {v / ref:.4f} ({100 * (v / ref - 1):+.2f}%)")
secs = {}
for m in modes:
    steps = [l for l in lines(m + "-slow") if "elapsed_s" in l]
    secs[m] = steps[-1]["elapsed_s"]
    print(f"straggler (worker {int(W) - 1} x{slow}): {m:>5} {secs[m]:8.1f} s, worker 0 made {len(steps)} steps")
for m in modes[1:]:
    print(f"throughput: {m} / sync with a x{slow} straggler = {secs['sync'] / secs[m]:.2f}x")
PY
bench/plot_runs.sh ps_async "$out" val_loss,loss   # FIGURE=PATH.svg|png to choose where
