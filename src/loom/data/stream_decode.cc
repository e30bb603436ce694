#include "loom/data/stream_decode.h"

#include <algorithm>
#include <span>

#include "loom/core/error.h"

namespace loom::data {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// Bytes at the end of `s` that a later piece may still change: up to 3 trailing U+FFFD, or
// the start of a UTF-8 sequence whose continuation bytes have not arrived.
size_t unstable_tail(std::string_view s) {
  size_t n = 0;
  for (int k = 0; k < 3 && s.size() >= n + kReplacement.size() &&
                  s.substr(s.size() - n - kReplacement.size(), kReplacement.size()) == kReplacement;
       k++)
    n += kReplacement.size();
  if (n > 0) return n;
  // An incomplete sequence: a lead byte within the last 3 bytes whose length runs past the end.
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); back++) {
    const uint8_t c = uint8_t(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? back : 0;
  }
  return 0;
}

}  // namespace

std::string StreamDecoder::window_text() const {
  std::vector<int32_t> all(context_);
  all.insert(all.end(), window_.begin(), window_.end());
  const std::string full = tok_.decode(all);
  const std::string prefix = tok_.decode(context_);
  // The anchor only moves where nothing is pending, so the context's text is final and the
  // window's text follows it.
  LOOM_ASSERT(full.compare(0, prefix.size(), prefix) == 0, "the ", tok_.kind(),
              " tokenizer's decode changed text already streamed (Note [Streaming decode])");
  return full.substr(prefix.size());
}

void StreamDecoder::advance(bool keep_context) {
  context_.insert(context_.end(), window_.begin(), window_.end());
  if (context_.size() > kContext) context_.erase(context_.begin(), context_.end() - kContext);
  if (!keep_context) context_.clear();
  window_.clear();
  emitted_ = 0;
}

std::string StreamDecoder::push(int32_t id) {
  window_.push_back(id);
  const std::string text = window_text();
  const bool overlong = window_.size() >= kMaxWindow;
  const size_t hold = overlong ? 0 : unstable_tail(text);
  std::string out;
  if (text.size() - hold > emitted_) {
    out = text.substr(emitted_, text.size() - hold - emitted_);
    emitted_ = text.size() - hold;
  }
  if (overlong) advance(/*keep_context=*/unstable_tail(text) == 0);
  else if (hold == 0 && window_.size() >= kWindow) advance(true);
  return out;
}

std::string StreamDecoder::finish() {
  const std::string text = window_text();
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  advance(unstable_tail(text) == 0);
  return out;
}

}  // namespace loom::data
