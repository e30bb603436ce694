#!/usr/bin/env bash
# Tokenizer speed and exactness against the reference implementation on the same text:
# `loom tokenizer encode` vs Hugging Face tokenizers.js (node) on a GPT-2 tokenizer.json and
# a Llama-3-style one, and vs spm_encode for a SentencePiece model. Both sides run as whole
# processes (load + encode + print), one thread each; ids must be identical.
#   bench/tokenize_vs_ref.sh [MB]      (default 8: Debian's fortunes repeated to that size)
# Needs the npm packages of tests/reference/write_tokenizer_fixtures.sh (build/npm-ref).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mb=${1:-8}
loom=$root/build/release/loom
fx=$root/tests/reference/fixtures/tokenizers
export LOOM_NPM_REF=${LOOM_NPM_REF:-$root/build/npm-ref/node_modules}
[[ -d $LOOM_NPM_REF/@huggingface/tokenizers ]] ||
  npm install --no-audit --no-fund --prefix "$(dirname "$LOOM_NPM_REF")" @huggingface/tokenizers@0.2.0 gpt-3-encoder@1.1.4 >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The corpus: fortunes' text files, whole, until the size is reached.
files=$(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort)
while (( $(stat -c %s "$tmp/text" 2>/dev/null || echo 0) < mb * 1000000 )); do cat $files >> "$tmp/text"; done
head -c $((mb * 1000000)) "$tmp/text" | iconv -f utf-8 -t utf-8 -c > "$tmp/t" && mv "$tmp/t" "$tmp/text"
bytes=$(stat -c %s "$tmp/text")
python3 "$root/tests/reference/make_tokenizer_json.py" "$fx/gpt2/vocab.json" "$fx/gpt2/merges.txt" "$tmp/gpt2.json"
python3 "$root/tests/reference/make_tokenizer_json.py" "$fx/gpt2/vocab.json" "$fx/gpt2/merges.txt" "$tmp/llama3.json" --llama3
secs() { local t0 t1; t0=$(date +%s.%N); "$@"; t1=$(date +%s.%N); awk "BEGIN{print $t1 - $t0}"; }
calc() { awk "BEGIN{print $1}"; }
printf "%-22s %10s %10s %10s %8s %s\n" tokenizer "loom MB/s" "ref MB/s" "tokens" ratio "ids"
for name in gpt2 llama3; do
  tl=$(secs sh -c "OMP_NUM_THREADS=1 '$loom' tokenizer encode --tokenizer '$tmp/$name.json' --in '$tmp/text' --json > '$tmp/loom.ids'")
  tr=$(secs sh -c "node '$root/tests/reference/tokenizer_ref.mjs' hf '$tmp/$name.json' '$tmp/text' > '$tmp/ref.ids'")
  same=$(python3 -c "import json,sys; a=json.load(open('$tmp/loom.ids')); b=json.load(open('$tmp/ref.ids')); print(len(a), 'identical' if a==b else 'DIFFER')")
  printf "%-22s %10.2f %10.2f %10s %8.2f %s\n" "$name (tokenizers.js)" "$(calc "$bytes/1e6/$tl")" \
    "$(calc "$bytes/1e6/$tr")" ${same% *} "$(calc "$tr/$tl")" "${same#* }"
done
# loom data prepare (2 threads, fortunes split into documents at "%" lines; shards written)
# against tokenizers.js's single-threaded encode of the same text (from the gpt2 row).
tp=$(secs sh -c "'$loom' data prepare --tokenizer '$tmp/gpt2.json' --in '$tmp/text' --out '$tmp/shards' --doc-separator % --threads 2 > /dev/null")
tr=$(secs sh -c "node '$root/tests/reference/tokenizer_ref.mjs' hf '$tmp/gpt2.json' '$tmp/text' > /dev/null")
printf "%-22s %10.2f %10.2f %10s %8.2f %s\n" "prepare gpt2, 2 thr" "$(calc "$bytes/1e6/$tp")" "$(calc "$bytes/1e6/$tr")" \
  "-" "$(calc "$tr/$tp")" "shards written"
# SentencePiece: spm_encode works line by line, so loom encodes the same lines (--lines).
model=$fx/fortunes-1k.model
tl=$(secs sh -c "'$loom' tokenizer encode --tokenizer '$model' --in '$tmp/text' --lines > '$tmp/loom.ids'")
tr=$(secs sh -c "spm_encode --model '$model' --output_format=id < '$tmp/text' > '$tmp/ref.ids'")
same=$(cmp -s "$tmp/loom.ids" "$tmp/ref.ids" && echo identical || echo DIFFER)
printf "%-22s %10.2f %10.2f %10s %8.2f %s\n" "spm 1k (spm_encode)" "$(calc "$bytes/1e6/$tl")" \
  "$(calc "$bytes/1e6/$tr")" "$(wc -w < "$tmp/loom.ids")" "$(calc "$tr/$tl")" "$same"
echo "text: $bytes bytes of fortunes; ratio = reference time / loom time (> 1: loom faster)"
