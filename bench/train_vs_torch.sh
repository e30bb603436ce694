#!/usr/bin/env bash
# Training throughput: loom vs PyTorch (Debian python3-torch), interleaved in one run, in
# fp32 and in bf16 (loom train.precision = bf16 against torch.autocast("cpu", bfloat16)).
# Both sides: 2 threads, OPENBLAS_CORETYPE unset (AVX-512 GEMM). The peer gets tcmalloc.
# peak_GF/s is the in-process GEMM peak of the row's precision (sgemm, or oneDNN bf16).
# Usage: bench/train_vs_torch.sh [steps] [configs...]   (needs scripts/setup.sh --oracle)
#        PRECISIONS="bf16" bench/train_vs_torch.sh 8 C    (default: "fp32 bf16")
# REPEAT=n runs each side n times, alternating, and reports each side's median run.
# RECORD=1 appends each row to bench/results/10-training.jsonl (scripts/results.py record;
# then scripts/results.py build refreshes docs/results.md).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}; shift || true
configs=${*:-A B C}
precisions=${PRECISIONS:-fp32 bf16}
tcmalloc=$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null || true)
export OMP_NUM_THREADS=2
export BENCH_COMMAND="${REPEAT:+REPEAT=$REPEAT }${PRECISIONS:+PRECISIONS=\"$PRECISIONS\" }bench/train_vs_torch.sh $steps $configs"
printf "%-4s %-5s %12s %12s %7s %10s %10s %9s %9s %10s %10s %10s\n" cfg prec loom_tok/s torch_tok/s ratio loom_GF/s torch_GF/s \
  peak_GF/s loom/peak loom_act_MiB loom_MiB torch_MiB
for c in $configs; do
  for p in $precisions; do
    ls=() ts=()
    for ((r = 0; r < ${REPEAT:-1}; r++)); do  # alternating, so a slow spell of the VM hits both sides
      ls+=("$(env -u OPENBLAS_CORETYPE build/release/bench/bench_train "$c" "$steps" "$p")")
      ts+=("$(env -u OPENBLAS_CORETYPE LD_PRELOAD="$tcmalloc" /usr/bin/python3 bench/torch_peer.py "$c" "$steps" "$p")")
    done
    /usr/bin/python3 - "${#ls[@]}" "${ls[@]}" "${ts[@]}" <<'PY'
import json, sys
n = int(sys.argv[1])
runs = [json.loads(a) for a in sys.argv[2:]]
def median_run(rs):  # the run with the median tokens/s (n odd) or the lower middle one
    return sorted(rs, key=lambda r: r["tokens_per_s"])[(len(rs) - 1) // 2]
l, t = median_run(runs[:n]), median_run(runs[n:])
if n > 1:  # every run, in order, so the spread is on record
    print("# %s %s runs: loom %s, torch %s" % (l["config"], l["precision"],
          " ".join("%.0f" % r["tokens_per_s"] for r in runs[:n]), " ".join("%.0f" % r["tokens_per_s"] for r in runs[n:])))
print("%-4s %-5s %12.0f %12.0f %7.2f %10.1f %10.1f %9.1f %9.2f %10.0f %10.0f %10.0f" % (
    l["config"], l["precision"], l["tokens_per_s"], t["tokens_per_s"], l["tokens_per_s"] / t["tokens_per_s"],
    l["model_gflops"], t["model_gflops"], l["gemm_peak_gflops"], l["model_gflops"] / l["gemm_peak_gflops"],
    l["activation_mib"], l["peak_rss_mib"], t["peak_rss_mib"]))
import os, subprocess
if os.environ.get("RECORD") == "1":  # the same claim names as the rows already in the file
    name = {"A": "tiny GPT (config A)", "B": "small GPT (config B)", "C": "GPT-2 124M (config C)"}[l["config"]]
    prec = "fp32" if l["precision"] == "fp32" else l["precision"] + " vs autocast"
    subprocess.run([sys.executable, "scripts/results.py", "record", "10-training.jsonl", "--claim", name + ", " + prec,
                    "--loom", "%.0f" % l["tokens_per_s"], "--peer", "%.0f" % t["tokens_per_s"],
                    "--peer-name", "PyTorch %s (Debian), tcmalloc" % t.get("torch_version", "1.13"), "--unit", "tok/s",
                    "--ratio", "%.2f" % (l["tokens_per_s"] / t["tokens_per_s"]), "--command", os.environ["BENCH_COMMAND"]],
                   check=True)
PY
  done
done
