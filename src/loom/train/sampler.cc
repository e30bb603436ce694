#include "loom/train/sampler.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <span>

#include "loom/core/error.h"
#include "loom/model/model.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/data/stream_decode.h"
#include "loom/data/tokenizer.h"
#include "loom/data/loader.h"

namespace loom {

namespace {

std::unique_ptr<data::Tokenizer> sampling_tokenizer(const std::string& dir, const Config& cfg, const std::string& given) {
  const std::string path = given.empty() ? cfg.data.tokenizer : given;
  if (path.empty() && !cfg.data.shards.empty())
    throw ConfigError("checkpoint '" + dir + "' was trained on data.shards = '" + cfg.data.shards +
                      "' without data.tokenizer: pass the tokenizer that wrote them with --tokenizer PATH");
  return data::load_tokenizer(path);
}

}  // namespace

void sample(const std::string& checkpoint_dir, const SampleOptions& opt,
            const std::function<void(std::string_view)>& emit) {
  LOOM_CHECK(opt.tokens >= 0, "--tokens ", opt.tokens, ": expected a count >= 0");
  LOOM_CHECK(opt.temperature >= 0 && std::isfinite(opt.temperature), "--temperature ", opt.temperature,
             ": expected a finite value >= 0 (0 = greedy)");
  const int64_t bad = first_invalid_utf8(reinterpret_cast<const uint8_t*>(opt.prompt.data()), int64_t(opt.prompt.size()));
  LOOM_CHECK(bad < 0, "--prompt is not valid UTF-8 at byte ", bad);
  CheckpointData ck = load_checkpoint(checkpoint_dir);
  const ModelConfig& mc = ck.config.model;
  Model model(mc, 1, mc.ctx);
  LOOM_CHECK(ck.params.size() == model.params().size(), checkpoint_dir, ": the checkpoint holds ", ck.params.size(),
             " parameters but its config describes ", model.params().size());
  std::copy(ck.params.begin(), ck.params.end(), model.params().begin());

  const auto tok = sampling_tokenizer(checkpoint_dir, ck.config, opt.tokenizer);
  LOOM_CHECK(tok->vocab_size() <= mc.vocab, "the tokenizer's vocabulary (", tok->vocab_size(),
             ") is larger than the model's (model.vocab = ", mc.vocab, "): not the tokenizer it was trained with");
  std::vector<int32_t> seq = tok->encode(opt.prompt, data::Special::kPlain);
  if (seq.empty() && tok->end_of_document() >= 0) seq.push_back(tok->end_of_document());
  if (seq.empty()) seq = tok->encode("\n");  // an empty prompt starts a fresh line
  data::StreamDecoder stream(*tok);
  std::mt19937_64 rng(opt.seed);
  std::vector<float> logits(mc.vocab);
  const int64_t usable = tok->vocab_size();
  for (int64_t i = 0; i < opt.tokens; i++) {
    const int64_t T = std::min<int64_t>(int64_t(seq.size()), mc.ctx);
    model.forward_last_logits(seq.data() + seq.size() - T, T, logits.data());
    if (opt.on_logits) opt.on_logits(i, std::span<const float>(logits.data(), size_t(usable)));
    int32_t next = 0;
    if (opt.temperature == 0) {
      next = int32_t(std::max_element(logits.begin(), logits.begin() + usable) - logits.begin());
    } else {
      const float mx = *std::max_element(logits.begin(), logits.begin() + usable);
      std::vector<double> p(usable);
      for (int64_t j = 0; j < usable; j++) p[j] = std::exp((logits[j] - mx) / opt.temperature);
      std::discrete_distribution<int32_t> dist(p.begin(), p.end());
      next = dist(rng);
    }
    seq.push_back(next);
    // Only the last model.ctx ids are read: keep memory bounded for any --tokens.
    if (int64_t(seq.size()) >= 2 * mc.ctx) seq.erase(seq.begin(), seq.end() - mc.ctx);
    const std::string piece = stream.push(next);
    if (!piece.empty()) emit(piece);
  }
  const std::string rest = stream.finish();
  if (!rest.empty()) emit(rest);
}

std::string sample(const std::string& checkpoint_dir, const SampleOptions& opt) {
  std::string out;
  sample(checkpoint_dir, opt, [&out](std::string_view piece) { out += piece; });
  return out;
}

}  // namespace loom
