#!/usr/bin/env bash
# Regenerates tests/reference/fixtures/tokenizers/expected.json from the reference
# implementations (not run by the tests; they read the committed file):
#   - Hugging Face tokenizers.js (@huggingface/tokenizers 0.2.0) for tokenizer.json files,
#   - gpt-3-encoder 1.1.4, a port of OpenAI's GPT-2 encoder.py (the source of gpt2/),
#   - spm_encode (Debian's sentencepiece) for fixtures/tokenizers/fortunes-1k.model,
#     which was written by `loom tokenizer train --vocab 1000` on Debian's fortunes.
# Needs node and npm (registry access) once; packages go to build/npm-ref.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
fx=$here/fixtures/tokenizers
export LOOM_NPM_REF=${LOOM_NPM_REF:-$root/build/npm-ref/node_modules}
if [[ ! -d $LOOM_NPM_REF/@huggingface/tokenizers || ! -d $LOOM_NPM_REF/gpt-3-encoder ]]; then
  npm install --no-audit --no-fund --prefix "$(dirname "$LOOM_NPM_REF")" @huggingface/tokenizers@0.2.0 gpt-3-encoder@1.1.4
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$here/make_tokenizer_json.py" "$fx/gpt2/vocab.json" "$fx/gpt2/merges.txt" "$tmp/gpt2.json"
python3 "$here/make_tokenizer_json.py" "$fx/gpt2/vocab.json" "$fx/gpt2/merges.txt" "$tmp/llama3.json" --llama3
node "$here/tokenizer_ref.mjs" hf "$tmp/gpt2.json" "$fx/sample.txt" > "$tmp/gpt2_hf"
node "$here/tokenizer_ref.mjs" gpt2 "$fx/gpt2" "$fx/sample.txt" > "$tmp/gpt2_openai"
node "$here/tokenizer_ref.mjs" hf "$tmp/llama3.json" "$fx/sample.txt" > "$tmp/llama3_hf"
# spm_encode encodes each line on its own (the newline is not part of its input).
spm_encode --model "$fx/fortunes-1k.model" --output_format=id < "$fx/sample.txt" > "$tmp/spm_lines"
python3 - "$tmp" "$fx/expected.json" <<'PY'
import json, sys
tmp, out = sys.argv[1], sys.argv[2]
r = lambda n: json.load(open(f"{tmp}/{n}"))
lines = [[int(t) for t in l.split()] for l in open(f"{tmp}/spm_lines").read().split("\n")[:-1]]
json.dump({"source": "tests/reference/write_tokenizer_fixtures.sh", "gpt2_hf": r("gpt2_hf"),
           "gpt2_openai_plain": r("gpt2_openai"), "llama3_hf": r("llama3_hf"), "spm_lines": lines},
          open(out, "w"), separators=(",", ":"))
print(f"wrote {out}")
PY
