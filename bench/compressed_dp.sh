#!/usr/bin/env bash
# Compressed data-parallel gradients against exact all-reduce (issue 16): config B (GPT-2
# vocabulary, 6 layers, d 384, T 256, global batch 8) at dp 2 across two namespace "hosts"
# joined by a veth pair shaped to RATE, one rank a host, every compressor from the same seed.
# Per mode: bytes on the wire per step and rank (the run's own report), mean step time (the
# logged steps after the first two), the validation curve and the final validation loss
# against exact's. Needs root (scripts/netns_two_hosts.sh).
# usage: bench/compressed_dp.sh [RATE] [STEPS] [VAL_EVERY]    e.g. bench/compressed_dp.sh 1gbit 300 50
# MODES overrides the list, e.g. MODES="none powersgd"; mode accordion is PowerSGD under
# Accordion (rank 4 light, rank 1 heavy) with a window of STEPS / 6 steps. EXTRA adds --set
# keys to every mode, e.g. EXTRA="parallel.compress_warmup_steps=20". Modes zero3, qwz, qgz,
# hpz and zeropp (all three) run ZeRO-3 and ZeRO++ against zero3, e.g.
# MODES="zero3 qwz qgz hpz zeropp" bench/compressed_dp.sh 1gbit 20 20. PRECISION=bf16 runs
# every mode in bf16 (default fp32). OPENBLAS_CORETYPE is unset (AVX-512 GEMMs).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1gbit} steps=${2:-300} every=${3:-50}
modes=${MODES:-"none powersgd topk terngrad int8"}
tmp=$(mktemp -d)
trap 'scripts/netns_two_hosts.sh down; rm -rf "$tmp"' EXIT
scripts/netns_two_hosts.sh up "$rate" >/dev/null
model=(model.preset=gpt2 model.layers=6 model.d_model=384 model.heads=6 model.ffn=1536 model.ctx=256 train.batch=8)
for m in $modes; do
  extra=(parallel.compress=$m)
  [ "$m" = topk ] && extra+=(parallel.compress_ratio=0.01)  # the issue's top-k 1%
  [ "$m" = accordion ] && extra=(parallel.compress=powersgd parallel.compress_adapt=accordion
                                 "parallel.accordion_window=$(( steps / 6 > 0 ? steps / 6 : 1 ))")
  case $m in  # ZeRO-3 and ZeRO++ (issue 16 item 4): zero3 is their reference
    zero3) extra=(parallel.zero=3) ;;
    qwz|qgz|hpz) extra=(parallel.zero=3 "parallel.zeropp_$m=true") ;;
    zeropp) extra=(parallel.zero=3 parallel.zeropp_qwz=true parallel.zeropp_qgz=true parallel.zeropp_hpz=true) ;;
  esac
  sets=()
  for kv in "${model[@]}" "${extra[@]}" ${EXTRA:-} checkpoint.dir= train.threads=1 "train.steps=$steps" \
            "train.precision=${PRECISION:-fp32}" \
            "train.val_every=$every" train.val_batches=4 train.log_every=1; do sets+=(--set "$kv"); done
  env -u OPENBLAS_CORETYPE scripts/netns_two_hosts.sh run 1 -- "$PWD/build/release/loom" train --dp 2 --json "${sets[@]}" \
    >"$tmp/$m.jsonl" 2>"$tmp/$m.err" || { echo "$m failed:"; tail -5 "$tmp/$m.err"; exit 1; }
done
/usr/bin/python3 - "$tmp" "$rate" $modes <<'PY'
import json, re, sys
tmp, rate, modes = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = {}
for m in modes:
    rows = [json.loads(l) for l in open(f"{tmp}/{m}.jsonl") if l.startswith("{")]
    steps = [r for r in rows if "tokens_per_s" in r][2:]
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    tokens = 8 * 256
    step_s = sum(tokens / r["tokens_per_s"] for r in steps) / len(steps)
    err = open(f"{tmp}/{m}.err").read()
    wire = re.search(r"gradients on the wire: ([0-9.]+) MB per step from each rank \(([0-9.]+)x fewer", err)
    runs[m] = dict(val=val, step_s=step_s, mb=float(wire.group(1)), fewer=float(wire.group(2)))
    switches = [l for l in err.splitlines() if l.startswith("accordion:")]
    if switches:
        print(f"{m}: {len(switches)} accordion switches, e.g.\n  " + "\n  ".join(switches[:3]))
ref = runs.get("none") or runs.get("zero3")
print(f"config B, dp 2 across two hosts at {rate} each way, {max(ref['val']) if ref else '?'} steps")
print(f"{'mode':<10}{'MB/step':>10}{'x fewer':>9}{'step s':>9}{'speedup':>9}{'val loss':>10}{'vs exact':>10}")
for m, r in runs.items():
    last = max(r["val"])
    sp = ref["step_s"] / r["step_s"] if ref else float("nan")
    rel = r["val"][last] / ref["val"][last] - 1 if ref else float("nan")
    print(f"{m:<10}{r['mb']:>10.2f}{r['fewer']:>9.1f}{r['step_s']:>9.3f}{sp:>9.2f}{r['val'][last]:>10.4f}{100 * rel:>+9.2f}%")
print("validation curves:")
print(f"{'step':>6}" + "".join(f"{m:>10}" for m in runs))
for s in sorted(ref["val"] if ref else next(iter(runs.values()))["val"]):
    print(f"{s:>6}" + "".join(f"{runs[m]['val'].get(s, float('nan')):>10.4f}" for m in runs))
PY
bench/plot_runs.sh compressed_dp "$tmp" val_loss,loss,tokens_per_s   # FIGURE=PATH.svg|png to choose where
