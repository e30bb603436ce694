// Text generation from a checkpoint, with the tokenizer it was trained with.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace loom {

struct SampleOptions {
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 0.8;  // 0: greedy (argmax)
  uint64_t seed = 0;
  std::string tokenizer;  // empty: the checkpoint's data.tokenizer (the byte tokenizer when unset)
  // Called with each step's next-token logits (the tokenizer's ids) before the token is
  // drawn: checks against another implementation (`loom sample --logits`).
  std::function<void(int64_t step, std::span<const float> logits)> on_logits;
};

// Returns the continuation only (not the prompt). Only the tokenizer's ids are sampled
// (model.vocab may be larger). An empty prompt starts a document: the end-of-document token
// when the tokenizer has one, else a newline. The context window slides once the sequence
// reaches model.ctx.
// `emit` receives the continuation's text as it is sampled, each piece once it can no longer
// change (Note [Streaming decode]); the pieces concatenate to decode(continuation ids).
void sample(const std::string& checkpoint_dir, const SampleOptions& opt,
            const std::function<void(std::string_view)>& emit);
// The whole continuation at once.
std::string sample(const std::string& checkpoint_dir, const SampleOptions& opt);

}  // namespace loom
