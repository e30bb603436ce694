// Test helper: Debian's fortunes/people (one fortune per document) as token shards.
#pragma once

#include <string>

#include "loom/data/prepare.h"

namespace loom::testing_support {

// `tokenizer`: "byte" or a path under the fixtures' tokenizers/ folder (e.g.
// "fortunes-1k.model", "gpt2"); `shard_tokens` 0 keeps prepare's default; `file` another of
// the fortunes files (e.g. "computers").
inline void prepare_fortune_shards(const std::string& tokenizer, const std::string& out, int64_t shard_tokens = 0,
                                   const std::string& file = "people") {
  std::string path = tokenizer;
  if (tokenizer != "byte") path = std::string(LOOM_FIXTURE_DIR) + "/tokenizers/" + tokenizer;
  const auto tok = data::load_tokenizer(path);
  data::PrepareOptions o;
  o.in = "/usr/share/games/fortunes/" + file;
  o.out = out;
  o.doc_separator = std::string(1, '%');
  if (shard_tokens > 0) o.shard_tokens = shard_tokens;
  data::prepare_shards(*tok, path, o);
}

}  // namespace loom::testing_support
