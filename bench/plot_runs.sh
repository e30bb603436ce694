#!/usr/bin/env bash
# The figure of a benchmark that compares modes: every run's JSON lines in DIR drawn by
# `loom plot` on shared axes (Note [Run plots]), one curve a run, named by its file.
# Usage (from a benchmark script, at the repository root):
#   bench/plot_runs.sh NAME DIR [METRICS]   -> ${FIGURE:-runs/figures/NAME.svg} (or .png)
set -euo pipefail
name=$1 dir=$2 metrics=${3:-loss,val_loss}
out=${FIGURE:-runs/figures/$name.svg}
mkdir -p "$(dirname "$out")"
shopt -s nullglob
runs=("$dir"/*.jsonl)
((${#runs[@]})) || { echo "bench/plot_runs.sh: no *.jsonl in $dir" >&2; exit 1; }
build/release/loom plot "${runs[@]}" --metrics "$metrics" --out "$out" 2>/dev/null
echo "figure: $out (${#runs[@]} runs: $metrics)"
