// libFuzzer target: tokenizer.json. The input is the file's text; loading either throws
// loom::Error or gives a tokenizer whose decode inverts encode on a fixed multilingual text
// and whose ids are all inside its vocabulary.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "loom/core/error.h"
#include "loom/data/bpe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = loom::data::tokenizer_from_json(text, "fuzz.json");
    const std::string sample = "Hello, world! It's 2024: Grüße, 你好 😀\t  x\n\n<|endoftext|>";
    for (auto special : {loom::data::Special::kPlain, loom::data::Special::kRecognize}) {
      const auto ids = tok->encode(sample, special);
      for (int32_t id : ids)
        if (id < 0 || id >= tok->vocab_size()) std::abort();
      if (special == loom::data::Special::kPlain && tok->decode(ids) != sample) std::abort();
    }
  } catch (const loom::Error&) {
  }
  return 0;
}
