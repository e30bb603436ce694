#!/usr/bin/env bash
# Optimizer offload (issue 19, Note [Optimizer offload]) against in-memory AdamW, interleaved
# in one run (memory, offload, memory, offload): steady-state step time (mean over the steps
# after the first two), bytes the offload file read and wrote per step against the size of
# the moments, and the measured resident optimizer state. Default: config C (GPT-2 124M,
# seq 256, batch 4) on the fortunes corpus, fp32, 2 threads.
# Usage: bench/offload.sh [steps] [offload_dir] [sub_group_mb] [extra --set args...]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
dir=${2:-/var/tmp}
sub=${3:-16}
shift 3 || shift $#
loom=./build/release/loom
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--set model.preset=gpt2 --set model.ctx=256 --set train.seq=256 --set train.batch=4 --set "train.steps=$steps"
        --set train.val_every=0 --set train.val_batches=1 --set train.log_every=1 --set checkpoint.dir= --json "$@")
run() {  # name, extra sets...
  local name=$1
  shift
  $loom train "${common[@]}" "$@" >"$out/$name.jsonl" 2>"$out/$name.err"
}
for round in 1 2; do
  run "memory$round"
  run "offload$round" --set offload.optimizer=disk --set "offload.dir=$dir" --set "offload.sub_group_mb=$sub"
done
python3 - "$out" "$steps" "$sub" <<'PY'
import json, re, sys
out, steps, sub = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def parse(name):
    st = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.startswith("{") and '"loss"' in l]
    t = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(st[1:], st[2:])]  # steps 3..N
    err = open(f"{out}/{name}.err").read()
    mem = re.search(r"memory \(rank 0, peak resident MiB\):(.*)", err).group(1)
    opt = float(re.search(r"optimizer ([0-9.]+)", mem).group(1))
    total = re.search(r"at most ([0-9.]+ [GM]iB)", mem).group(1)
    io = re.search(r"offload: ([0-9.]+) (GiB|MiB) read, ([0-9.]+) (GiB|MiB) written", mem)
    scale = lambda v, u: float(v) * (1024 if u == "GiB" else 1)
    rd = scale(io.group(1), io.group(2)) if io else 0.0
    wr = scale(io.group(3), io.group(4)) if io else 0.0
    params = int(re.search(r"' (\d+) params", err).group(1))
    return sum(t) / len(t), opt, total, rd / steps, wr / steps, params, st[-1]["loss"]
rows = {n: parse(n) for n in ("memory1", "offload1", "memory2", "offload2")}
params = rows["memory1"][5]
moments_mib = 2 * 4 * params / 2**20
print(f"config C (GPT-2 124M, seq 256, batch 4), {steps} steps, sub-groups of {sub} MiB; "
      f"AdamW moments {moments_mib:.0f} MiB ({params} params)")
print(f"{'run':<10}{'s/step':>9}{'optimizer MiB':>15}{'peak':>12}{'read MiB/step':>15}{'written MiB/step':>18}{'last loss':>11}")
for n, r in rows.items():
    print(f"{n:<10}{r[0]:>9.3f}{r[1]:>15.1f}{r[2]:>12}{r[3]:>15.0f}{r[4]:>18.0f}{r[6]:>11.4f}")
mem = (rows["memory1"][0] + rows["memory2"][0]) / 2
off = (rows["offload1"][0] + rows["offload2"][0]) / 2
same = rows["memory1"][6] == rows["offload1"][6] == rows["memory2"][6] == rows["offload2"][6]
print(f"offload / in-memory step time: {off / mem:.3f}x; per step the file moved "
      f"{(rows['offload1'][3] + rows['offload1'][4]) / moments_mib:.2f}x the moments; "
      f"losses {'identical' if same else 'DIFFER'}")
PY
