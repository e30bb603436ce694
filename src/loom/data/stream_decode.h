// Text of a token stream as it grows, for `loom sample`: pieces are emitted as soon as they
// can no longer change.
//
// Note [Streaming decode]: decode() is not concatenative for every tokenizer. SentencePiece
// drops the leading space of the first piece of a text, and its byte-fallback pieces
// (<0xE3> <0x81> <0x82>) render as U+FFFD until the character they spell is complete. So
// the decoder keeps a window of ids since an anchor plus a few ids of context before it,
// decodes context + window, and takes the window's text as what follows the context's own
// text. Of that, it holds back a tail that a later id may still change: trailing U+FFFD
// characters (at most 3: no UTF-8 character is longer than 4 bytes) and an incomplete UTF-8
// sequence. The anchor moves to the end of the window once nothing is held back.
// Invariant (tested on every tokenizer over random ids): the concatenation of everything
// push() and finish() return equals decode(all ids). The one exception: 4096 ids in a row
// that each end in an unfinished character are flushed as they are and the next window is
// decoded without context (SentencePiece may then drop one leading space).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  // The text that id makes final (often empty while a character is incomplete).
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character renders as the tokenizer decodes it).
  std::string finish();

 private:
  // decode(context + window) past the context's own text.
  std::string window_text() const;
  // Moves the anchor to the window's end; without context after text that may still change.
  void advance(bool keep_context);

  static constexpr size_t kContext = 8;        // ids kept before the anchor
  static constexpr size_t kWindow = 32;        // ids after which the anchor moves when it can
  static constexpr size_t kMaxWindow = 4096;   // past this, pending text is flushed regardless
  const Tokenizer& tok_;
  std::vector<int32_t> context_, window_;
  size_t emitted_ = 0;  // bytes of window_text() already returned
};

}  // namespace loom::data
