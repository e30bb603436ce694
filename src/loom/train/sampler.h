// Text generation from a checkpoint with the byte tokenizer.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct SampleOptions {
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 0.8;  // 0: greedy (argmax)
  uint64_t seed = 0;
};

// Returns the continuation only (not the prompt). Tokens past the byte range are never
// sampled (the byte tokenizer cannot decode them). The context window slides once the
// sequence reaches model.ctx.
std::string sample(const std::string& checkpoint_dir, const SampleOptions& opt);

}  // namespace loom
