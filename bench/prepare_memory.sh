#!/usr/bin/env bash
# Issue 59: `loom data prepare` of one huge document in bounded memory (Note [Document
# pieces]). Builds a single-document text of SIZE_MB (default 200) from fortunes, prepares
# it with the byte tokenizer, GPT-2's BPE and a SentencePiece model, and prints each run's
# peak resident memory (GNU time's maxrss) per input byte against the issue's target
# (under 1 GB for 200 MB). BEFORE_MB (default 20) also runs SentencePiece with pieces off
# (--piece-bytes past the document), the way prepare encoded before, on a smaller document.
#   bench/prepare_memory.sh [build/release/loom]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
loom=${1:-$root/build/release/loom}
size_mb=${SIZE_MB:-200}
before_mb=${BEFORE_MB:-20}
tmp=$(mktemp -d /tmp/loom-prepare-mem-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fixtures=$root/tests/reference/fixtures/tokenizers
make_doc() {  # $1 MB of fortunes with the % separator lines dropped: one document
  local mb=$1 out=$2
  : > "$out"
  while [[ $(stat -c %s "$out") -lt $((mb * 1000000)) ]]; do
    for f in /usr/share/games/fortunes/*; do [[ $f == *.dat || $f == *.u8 ]] || grep -hv '^%$' "$f"; done | iconv -f utf-8 -t utf-8 -c >> "$out" || true
  done
  truncate -s $((mb * 1000000)) "$out"
  iconv -f utf-8 -t utf-8 -c "$out" > "$out.ok" && mv "$out.ok" "$out"  # the cut may split a character
}
run() {  # name, input, extra flags...
  local name=$1 in=$2; shift 2
  local bytes; bytes=$(stat -c %s "$in")
  rm -rf "$tmp/out"
  /usr/bin/time -f '%M %e' -o "$tmp/time" "$loom" data prepare --in "$in" --out "$tmp/out" --val-fraction 0 "$@" \
    > "$tmp/log" 2>&1 || { cat "$tmp/log"; return 1; }
  read -r kb secs < "$tmp/time"
  awk -v n="$name" -v kb="$kb" -v b="$bytes" -v s="$secs" 'BEGIN {
    printf "%-44s input %7.1f MB  peak RSS %7.1f MB  %5.2f bytes per input byte  %6.1f s\n", n, b / 1e6, kb * 1024 / 1e6, kb * 1024 / b, s }'
}
make_doc "$size_mb" "$tmp/big.txt"
echo "loom data prepare of one ${size_mb} MB document (target: peak RSS under 1 GB, a few bytes per input byte)"
run "byte" "$tmp/big.txt" --tokenizer byte
run "gpt2 BPE" "$tmp/big.txt" --tokenizer "$fixtures/gpt2"
run "sentencepiece (fortunes-1k.model)" "$tmp/big.txt" --tokenizer "$fixtures/fortunes-1k.model"
make_doc "$before_mb" "$tmp/small.txt"
echo "before (no pieces) against after, one ${before_mb} MB document, SentencePiece:"
run "sentencepiece, whole document" "$tmp/small.txt" --tokenizer "$fixtures/fortunes-1k.model" --piece-bytes 1000000000000
run "sentencepiece, pieces of 256 KiB (default)" "$tmp/small.txt" --tokenizer "$fixtures/fortunes-1k.model"
