#!/usr/bin/env bash
# Runs tests/mpi/mpi_fault_probe under mpirun and checks that the job fails fast (well
# inside the 30 s the late rank sleeps) with the expected diagnosis.
# usage: check_fault.sh PROBE NP MODE PATTERN...
set -u
probe=$1 np=$2 mode=$3
shift 3
start=$(date +%s%N)
out=$(mpirun -np "$np" "$probe" "$mode" 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out"
echo "exit code $rc after ${elapsed_ms} ms"
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
(( elapsed_ms < 20000 )) || { echo "FAIL: took ${elapsed_ms} ms"; exit 1; }
for pattern in "$@"; do
  grep -qF -- "$pattern" <<<"$out" || { echo "FAIL: output lacks: $pattern"; exit 1; }
done
echo PASS
