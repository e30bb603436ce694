#!/usr/bin/env bash
# Fuzzes loom's hostile-input readers with libFuzzer (clang, ASan + UBSan): the config
# parser, the sharded-checkpoint manifest, the safetensors reader, the data loader,
# tokenizer.json and token shards.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, all six)
# Each target starts from fuzz/corpus/<target> and keeps what it finds in
# build/fuzz/corpus/<target>; a crash, hang (> 10 s) or leak stops it, leaves the input in
# build/fuzz/crashes/ and makes this script exit non-zero. LOOM_FUZZ_SEED fixes libFuzzer's
# random seed (CI sets 1 so a run explores the same way each time; unset: a new seed each run).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(config manifest safetensors data tokenizer shard)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${targets[@]/#/fuzz_}"
mkdir -p build/fuzz/crashes
status=0
for t in "${targets[@]}"; do
  mkdir -p "build/fuzz/corpus/$t"
  log="build/fuzz/$t.log"
  if build/fuzz/fuzz/fuzz_"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      ${LOOM_FUZZ_SEED:+-seed="$LOOM_FUZZ_SEED"} \
      -artifact_prefix="build/fuzz/crashes/$t-" "build/fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz $t: ${seconds} s, $runs inputs, no crash (corpus $(ls "build/fuzz/corpus/$t" | wc -l) files)"
  else
    status=1
    echo "fuzz $t: FAILED - see $log and build/fuzz/crashes/"
    grep -m5 -E 'ERROR|SUMMARY|runtime error' "$log" || tail -20 "$log"
  fi
done
exit $status
