#!/usr/bin/env bash
# Makes (once) and prints the default job's data: a 2,048-piece SentencePiece vocabulary
# learned on Debian's fortunes and the fortunes as token shards (one fortune per document),
# cached in runs/data/fortunes-sp2048/. Needs build/release/loom.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=runs/data/fortunes-sp2048
mkdir -p "$cache"
[[ -f "$cache/tokenizer.model" ]] ||
  ./build/release/loom tokenizer train --vocab 2048 --out "$cache/tokenizer.model" >&2
[[ -f "$cache/shards/prepare.json" ]] ||
  ./build/release/loom data prepare --tokenizer "$cache/tokenizer.model" --in /usr/share/games/fortunes \
    --out "$cache/shards" --doc-separator % --overwrite >&2
echo "$cache"
