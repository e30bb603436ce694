#!/usr/bin/env bash
# Async against sync parameter servers with a straggler across two hosts (issue 18): config B
# (GPT-2 shape, dense PS) on the 1 Gbit namespace pair of scripts/netns_two_hosts.sh (already
# up), 2 workers on one "host" and 2 servers on the other, worker 1 slowed 2x; prints worker
# 0's steps and the run's seconds (both modes train the same 2 x steps pushes).
# Usage: bench/ps_async_netns.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for m in sync async; do
  env -u OPENBLAS_CORETYPE scripts/netns_two_hosts.sh run 2 -- build/release/loom train --dp 2 --set parallel.ps_servers=2 \
    --set ps.mode=$m --set ps.slow_worker=1 --set ps.slow_factor=2 \
    --set model.preset=gpt2 --set model.layers=6 --set model.d_model=384 --set model.heads=6 --set model.ffn=1536 \
    --set model.ctx=256 --set train.batch=8 --set "train.steps=$steps" --set train.val_every=0 --set train.val_batches=1 \
    --set checkpoint.dir= --set train.threads=1 --set train.log_every=1 --json > "$out/$m.jsonl" 2>"$out/$m.err" || { tail "$out/$m.err"; exit 1; }
  python3 -c "
import json
l=[json.loads(x) for x in open('$out/$m.jsonl') if x.startswith('{')]
s=[x for x in l if 'elapsed_s' in x]
print('$m', len(s), 'worker-0 steps', round(s[-1]['elapsed_s'],1), 's')"
done
