#!/usr/bin/env bash
# Note [Preflight]: two ranks launched with different configs (mpirun's MPMD form) are refused
# before step 1 on both, naming rank 1 and its host, and the job ends with the config exit
# code (2) instead of training or hanging; the same for two ranks of one config where rank 1
# runs another build (a copy of loom without its build-id note: another executable).
#   check_preflight.sh LOOM
set -uo pipefail
loom=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
common=(train --json --dp 2 --set train.val_batches=1 model.layers=1 checkpoint.dir=)
mpirun -np 1 "$loom" "${common[@]}" train.steps=2 : -np 1 "$loom" "${common[@]}" train.steps=3 \
  > "$tmp/out" 2> "$tmp/err"
rc=$?
fail() { echo "FAIL: $*"; echo "--- stderr:"; cat "$tmp/err"; exit 1; }
[[ $rc -ne 0 ]] || fail "mpirun exited 0"
grep -q "preflight: the ranks do not run the same job" "$tmp/err" || fail "no preflight refusal"
grep -q "rank 1 on host $(hostname)" "$tmp/err" || fail "rank 1 and its host not named"
grep -q "was given another config" "$tmp/err" || fail "the config difference not named"
grep -q '"step"' "$tmp/out" && fail "a step ran"
echo "ok: another config refused before step 1 (mpirun exit $rc)"

objcopy --remove-section .note.gnu.build-id "$loom" "$tmp/other-loom" || fail "objcopy could not copy loom"
mpirun -np 1 "$loom" "${common[@]}" train.steps=2 : -np 1 "$tmp/other-loom" "${common[@]}" train.steps=2 \
  > "$tmp/out" 2> "$tmp/err"
rc=$?
[[ $rc -ne 0 ]] || fail "mpirun exited 0 with two builds"
grep -q "rank 1 on host $(hostname) runs another loom build" "$tmp/err" || fail "the other build not named"
grep -q '"step"' "$tmp/out" && fail "a step ran"
echo "ok: another build refused before step 1 (mpirun exit $rc)"
