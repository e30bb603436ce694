#!/usr/bin/env bash
# Slurm runs loom's ranks (issue 54): a one-machine Slurm cluster (Debian's slurm-wlm; its
# controller and node daemon started here with auth/none on private ports, stopped at exit)
# runs `srun --mpi=pmix -n 4 loom train --dp 4 ...`; loom takes its world from the
# allocation (PMIx) and its checkpoint equals, bit for bit, the one `loom train --nproc 4`
# writes. Exits 77 (ctest SKIP) without slurm-wlm or root.
#   check_slurm.sh LOOM
set -uo pipefail
loom=$1
for b in srun slurmctld slurmd; do
  command -v "$b" >/dev/null || { echo "SKIP: no $b (apt-get install slurm-wlm)"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "SKIP: the test's slurmd runs as root"; exit 77; }
tmp=$(mktemp -d)
host=$(hostname)
port=$((17000 + RANDOM % 2000))
mkdir -p "$tmp/state" "$tmp/spool"
cat > "$tmp/slurm.conf" <<CONF
ClusterName=loomtest
SlurmctldHost=$host
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SlurmctldPort=$port
SlurmdPort=$((port + 1))
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/ctld.pid
SlurmdPidFile=$tmp/d.pid
SlurmctldLogFile=$tmp/ctld.log
SlurmdLogFile=$tmp/d.log
SlurmUser=root
SlurmdUser=root
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/linear
SlurmdParameters=config_overrides
NodeName=$host CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -i > "$tmp/ctld.out" 2>&1 &
ctld=$!
slurmd -D > "$tmp/d.out" 2>&1 &
d=$!
trap 'kill $ctld $d 2>/dev/null; wait $ctld $d 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log "$tmp"/*.out "$tmp"/run.*; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
for i in $(seq 1 100); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 0.2; done
sinfo -h -o %t | grep -q idle || fail "the one-node Slurm cluster did not come up"
common=(train --dp 4 --set train.steps=6 model.layers=2 train.seq=64 train.threads=1 train.val_every=0 train.val_batches=1)
timeout 120 srun --mpi=pmix -n 4 "$loom" "${common[@]}" checkpoint.dir="$tmp/srun" > "$tmp/run.srun" 2>&1 ||
  fail "srun -n 4 loom train exited $?"
timeout 120 "$loom" "${common[@]}" checkpoint.dir="$tmp/nproc" --nproc 4 > "$tmp/run.nproc" 2>&1 ||
  fail "loom train --nproc 4 exited $?"
grep -q "layout pp 1 x dp 4 x tp 1 = 4 ranks" "$tmp/run.srun" || fail "srun's ranks did not form one world of 4"
for r in 0 1 2 3; do
  f=step-00000006/rank-0000$r.bin
  cmp -s "$tmp/srun/$f" "$tmp/nproc/$f" || fail "rank $r's checkpoint differs between srun and --nproc"
done
echo "ok: srun -n 4 trains as --nproc 4 does, bit for bit"
