// A compiled PCRE2 pattern (UTF-8, Unicode properties, JIT) that splits text into pieces:
// the pre-tokenizer of byte-level BPE. PCRE2 rather than std::regex: std::regex knows no
// \p{L} / \p{N} classes and is an order of magnitude slower.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

class SplitRegex {
 public:
  // `pattern` in PCRE2 syntax (a superset of what tokenizer.json's "Split" regexes use);
  // literal: match the text as is. Throws loom::Error naming the pattern and offset.
  SplitRegex(const std::string& pattern, bool literal = false);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Hugging Face "Split" with behavior Isolated: every match and every stretch of text
  // between matches is a piece, in order; the pieces cover `text` exactly. `text` must be
  // valid UTF-8 (callers check once). Appends (offset, length) pairs to `pieces`.
  void split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& pieces) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

// GPT-2's pre-tokenization pattern (what tokenizer.json's ByteLevel with use_regex = true means).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace loom::data
