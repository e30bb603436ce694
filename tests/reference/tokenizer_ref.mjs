// Reference encodings for loom's tokenizer tests (node; packages from write_tokenizer_fixtures.sh).
//   node tokenizer_ref.mjs hf TOKENIZER_JSON TEXT_FILE   -> ids from Hugging Face's tokenizers.js
//   node tokenizer_ref.mjs gpt2 VOCAB_DIR TEXT_FILE      -> ids from gpt-3-encoder (OpenAI's encoder.py, ported)
// Prints one JSON array of ids. No special-token template is added (add_special_tokens: false).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.env.LOOM_NPM_REF + "/");
const [mode, spec, textFile] = process.argv.slice(2);
const text = readFileSync(textFile, "utf8");
if (mode === "hf") {
  const { Tokenizer } = require("@huggingface/tokenizers");
  const tok = new Tokenizer(JSON.parse(readFileSync(spec, "utf8")), {});
  process.stdout.write(JSON.stringify(tok.encode(text, { add_special_tokens: false }).ids) + "\n");
} else if (mode === "gpt2") {
  const { encode } = require("gpt-3-encoder");
  process.stdout.write(JSON.stringify(encode(text)) + "\n");
} else {
  throw new Error("mode must be hf or gpt2, got " + mode);
}
