#!/usr/bin/env bash
# Parameter offload's chunk manager (issue 19, Note [Chunk manager]) under memory budgets,
# against in-memory training in the same run: steady-state step time (mean over the steps
# after the first two), parameter bytes read per step after the warm-up, the measured peak
# and the last loss (identical to in-memory's when the offload is exact). Default: config C
# (GPT-2 124M, seq 256, batch 4) on the fortunes corpus, fp32, 2 threads, 16 MiB chunks.
# Budgets are memory.limit_gib values; 0 is no budget (the units in use and one read ahead).
# GRADS=1 puts the gradients in chunks too (Note [Gradient chunks]; chunk_mb whole).
# LAYOUT adds arguments to every run, e.g. LAYOUT="--nproc 2 --dp 2 --set parallel.zero=3
# --set train.threads=1" (Note [ZeRO-3 offload]: each rank's own pieces; rank 0 reports).
# Usage: [GRADS=1] [LAYOUT=...] bench/param_chunks.sh [steps] [offload_dir] [chunk_mb] [budgets...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
dir=${2:-/var/tmp}
chunk=${3:-16}
shift 3 || shift $#
budgets=("${@:-0 1.6 3}")
read -r -a budgets <<<"${budgets[*]}"
loom=./build/release/loom
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--set model.preset=gpt2 --set model.ctx=256 --set train.seq=256 --set train.batch=4 --set "train.steps=$steps"
        --set train.val_every=0 --set train.val_batches=1 --set train.log_every=1 --set checkpoint.dir= --json)
read -r -a layout <<<"${LAYOUT:-}"
common+=("${layout[@]}")
$loom train "${common[@]}" >"$out/memory.jsonl" 2>"$out/memory.err"
grads=()
[[ "${GRADS:-0}" == 1 ]] && grads=(--set offload.grads=disk)
for b in "${budgets[@]}"; do
  $loom train "${common[@]}" "${grads[@]}" --set offload.optimizer=disk --set offload.params=disk --set "offload.dir=$dir" \
    --set "offload.chunk_mb=$chunk" --set "memory.limit_gib=$b" >"$out/budget-$b.jsonl" 2>"$out/budget-$b.err"
done
python3 - "$out" "$steps" "$chunk" "${GRADS:-0}" "${#budgets[@]}" "${budgets[@]}" "${layout[@]}" <<'PY'
import json, re, sys
out, steps, chunk, grads = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
budgets = sys.argv[6:6 + int(sys.argv[5])]
def mib(v, u):
    return float(v) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[u]
def parse(name):
    st = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.startswith("{") and '"loss"' in l]
    t = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(st[1:], st[2:])]  # steps 3..N
    err = open(f"{out}/{name}.err").read()
    total = re.search(r"at most ([0-9.]+) ([KMG]iB) at once", err)
    per = re.search(r"read per step, ([0-9.]+) ([KMG]i?B) in the last", err)
    ev = re.search(r"(\d+) evictions", err)
    nm = re.search(r"non-model memory ([0-9.]+) ([KMG]iB)", err)
    gs = re.search(r"chunks: ([0-9.]+) ([KMG]iB) spilled", err)
    params = int(re.search(r"' (\d+) params", err).group(1))
    return dict(s=sum(t) / len(t), peak=mib(*total.groups()), read=mib(*per.groups()) if per else 0.0,
                ev=int(ev.group(1)) if ev else 0, nm=mib(*nm.groups()) if nm else 0.0, params=params,
                spill=mib(*gs.groups()) / steps if gs else 0.0,
                loss=st[-1]["loss"])
mem = parse("memory")
pm = 4 * mem["params"] / 2**20
what = "parameters and gradients" if grads else "parameters"
print(f"config C (GPT-2 124M, seq 256, batch 4), {steps} steps, {what} offloaded in {chunk} MiB chunks; "
      f"parameters {pm:.0f} MiB; layout: {' '.join(sys.argv[6 + len(budgets):]) or 'one process'}")
print(f"{'run':<18}{'s/step':>8}{'vs memory':>11}{'peak MiB':>10}{'param MiB read, last step':>27}{'evictions':>11}{'last loss':>11}")
print(f"{'in memory':<18}{mem['s']:>8.2f}{1.0:>11.2f}{mem['peak']:>10.0f}{0:>27.0f}{0:>11}{mem['loss']:>11.4f}")
for b in budgets:
    r = parse(f"budget-{b}")
    name = "no budget" if float(b) == 0 else f"limit {b} GiB"
    print(f"{name:<18}{r['s']:>8.2f}{r['s'] / mem['s']:>11.2f}{r['peak']:>10.0f}{r['read']:>27.0f}{r['ev']:>11}"
          f"{r['loss']:>11.4f}{'' if r['loss'] == mem['loss'] else '  DIFFERS'}"
          + (f"  grads spilled {r['spill']:.0f} MiB/step" if grads else ""))
print(f"warm-up non-model memory: {r['nm']:.0f} MiB (activations, optimizer buffers"
      f"{'' if grads else ', gradients'})")
PY
