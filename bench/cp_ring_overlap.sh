#!/usr/bin/env bash
# Ring attention's overlap across two hosts (issue 53): cp 2, one rank on each "host" of
# scripts/netns_two_hosts.sh (already up, e.g. `scripts/netns_two_hosts.sh up 10gbit`), the
# K|V shifts of parallel.cp_mode = ring against the attention kernel beside them. From the
# run's trace: the forward and backward K|V shifts (each started just before a "cp ring step"
# kernel span) and how much of their time a kernel span of the same rank covers; the dK|dV
# shifts (started after a span ends, exposed by design) apart. Prints one line per rank and
# the total. Usage: bench/cp_ring_overlap.sh [seq] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
seq=${1:-2048}
steps=${2:-3}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
env -u OPENBLAS_CORETYPE scripts/netns_two_hosts.sh run 1 -- build/release/loom train --set parallel.cp=2 \
  --set parallel.cp_mode=ring --set model.layers=4 --set model.d_model=256 --set model.heads=4 --set model.ffn=1024 \
  --set "model.ctx=$seq" --set "train.seq=$seq" --set train.batch=2 --set "train.steps=$steps" --set train.val_every=0 \
  --set train.val_batches=1 --set checkpoint.dir= --set train.threads=1 --trace "$out/trace.json" > "$out/log" 2>&1 ||
  { tail "$out/log"; exit 1; }
python3 - "$out/trace.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
near = 500.0  # us: a shift is issued right before its kernel (forward / backward K|V) or right after it (dK|dV)
total = {"kv": 0.0, "hidden": 0.0, "grad": 0.0}
for pid in sorted({e.get("pid") for e in ev if e.get("cat") == "transfer"}):
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("pid") == pid and e.get("name", "").startswith("cp ring step")]
    shifts = [(e["ts"], e["ts"] + e["dur"]) for e in ev
              if e.get("pid") == pid and e.get("cat") == "transfer" and " cp[" in e.get("name", "")]
    kv = hidden = grad = 0.0
    for a, b in shifts:
        if any(0 <= s - a < near for s, _ in spans):
            kv += b - a
            hidden += sum(max(0.0, min(b, t) - max(a, s)) for s, t in spans)
        elif any(0 <= a - t < near for _, t in spans):
            grad += b - a
    print(f"rank {pid}: K|V shifts {kv / 1e3:.1f} ms, under a kernel {hidden / 1e3:.1f} ms "
          f"({100 * hidden / max(kv, 1e-9):.0f}%); dK|dV shifts {grad / 1e3:.1f} ms (exposed)")
    total["kv"] += kv; total["hidden"] += hidden; total["grad"] += grad
print(f"total: {100 * total['hidden'] / max(total['kv'], 1e-9):.0f}% of the K|V shift time under the attention kernel")
PY
