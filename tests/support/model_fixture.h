// What the PyTorch fixture tests share (tests/reference/write_fixtures.py and
// write_bf16_fixtures.py): the model a fixture was written for, and the error measure.
#pragma once

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/safetensors.h"

namespace loom::testing_support {

// The fixture's metadata "model" (its shape keys, as write_fixtures.py writes them).
inline ModelConfig fixture_model(const StFile& f) {
  const auto m = nlohmann::json::parse(f.metadata.at("model"));
  ModelConfig c;
  c.arch = m["arch"] == "gpt" ? Arch::kGpt : Arch::kLlama;
  c.layers = m["layers"], c.d_model = m["d_model"], c.heads = m["heads"], c.kv_heads = m["kv_heads"];
  c.ffn = m["ffn"], c.vocab = m["vocab"], c.ctx = m["ctx"], c.norm_eps = m["norm_eps"], c.rope_theta = m["rope_theta"];
  return c;
}

// max |a - b| / max |b|: error relative to the tensor's scale.
inline double rel_err(const float* a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); i++) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace loom::testing_support
