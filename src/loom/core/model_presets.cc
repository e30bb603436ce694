// The model presets: published shapes by name (model.preset).
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"

namespace loom {

namespace {

// Published shapes. GPT rows are Megatron-LM GPTs (learned positions, tied head, biases,
// ffn = 4 d): Narayanan et al. SC'21 Table 1 (vocab 51,200, seq 2,048), the 22B of
// Korthikanti et al. 2022 Table 5, and GPT-3 175B (Brown et al. 2020, vocab 50,257). Llama
// rows are the Hugging Face configs (config.json) of Meta's Llama-2 and Llama-3(.1) models.
struct Preset {
  const char* name;
  Arch arch;
  int64_t layers, d_model, heads, kv_heads, ffn, vocab, ctx;
  double rope_theta;
};
constexpr Preset kPresets[] = {
    // name          arch          layers d_model heads kv  ffn     vocab   ctx    rope
    {"tiny",         Arch::kGpt,   4,     128,    4,    4,  512,    256,    128,   1e4},
    {"gpt2",         Arch::kGpt,   12,    768,    12,   12, 3072,   50257,  1024,  1e4},
    {"gpt2-medium",  Arch::kGpt,   24,    1024,   16,   16, 4096,   50257,  1024,  1e4},
    // A small Llama-style model for the byte tokenizer: GQA 8:2, SwiGLU width ~8/3 d.
    {"llama",        Arch::kLlama, 8,     512,    8,    2,  1376,   256,    256,   1e4},
    {"gpt-1.7b",     Arch::kGpt,   24,    2304,   24,   24, 9216,   51200,  2048,  1e4},
    {"gpt-3.6b",     Arch::kGpt,   30,    3072,   32,   32, 12288,  51200,  2048,  1e4},
    {"gpt-7.5b",     Arch::kGpt,   36,    4096,   32,   32, 16384,  51200,  2048,  1e4},
    {"gpt-18b",      Arch::kGpt,   40,    6144,   48,   48, 24576,  51200,  2048,  1e4},
    {"gpt-22b",      Arch::kGpt,   48,    6144,   64,   64, 24576,  51200,  2048,  1e4},
    {"gpt-39b",      Arch::kGpt,   48,    8192,   64,   64, 32768,  51200,  2048,  1e4},
    {"gpt-76b",      Arch::kGpt,   60,    10240,  80,   80, 40960,  51200,  2048,  1e4},
    {"gpt-145b",     Arch::kGpt,   80,    12288,  96,   96, 49152,  51200,  2048,  1e4},
    {"gpt3-175b",    Arch::kGpt,   96,    12288,  96,   96, 49152,  50257,  2048,  1e4},
    {"gpt-310b",     Arch::kGpt,   96,    16384,  128,  128, 65536, 51200,  2048,  1e4},
    {"gpt-530b",     Arch::kGpt,   105,   20480,  128,  128, 81920, 51200,  2048,  1e4},
    {"gpt-1t",       Arch::kGpt,   128,   25600,  160,  160, 102400, 51200, 2048,  1e4},
    {"llama2-7b",    Arch::kLlama, 32,    4096,   32,   32, 11008,  32000,  4096,  1e4},
    {"llama2-13b",   Arch::kLlama, 40,    5120,   40,   40, 13824,  32000,  4096,  1e4},
    {"llama2-70b",   Arch::kLlama, 80,    8192,   64,   8,  28672,  32000,  4096,  1e4},
    {"llama3-8b",    Arch::kLlama, 32,    4096,   32,   8,  14336,  128256, 8192,  5e5},
    {"llama3-70b",   Arch::kLlama, 80,    8192,   64,   8,  28672,  128256, 8192,  5e5},
    {"llama3-405b",  Arch::kLlama, 126,   16384,  128,  8,  53248,  128256, 8192,  5e5},
};

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

void apply_model_preset(ModelConfig& m, const std::string& preset) {
  m.preset = preset;
  m.norm_eps = 1e-5;
  m.init_std = 0.02;
  if (preset == "custom") return;  // every model key comes from the file or --set
  for (const Preset& p : kPresets)
    if (preset == p.name) {
      m.arch = p.arch;
      m.layers = p.layers, m.d_model = p.d_model, m.heads = p.heads, m.kv_heads = p.kv_heads;
      m.ffn = p.ffn, m.vocab = p.vocab, m.ctx = p.ctx, m.rope_theta = p.rope_theta;
      return;
    }
  std::string names;
  for (const Preset& p : kPresets) names += std::string(p.name) + ", ";
  throw ConfigError("model.preset = '" + preset + "': expected one of " + names + "custom");
}

// Note [Model given by shape] (config.cc).
void complete_model_by_shape(ModelConfig& m, const std::vector<std::string>& given) {
  if (given.empty()) return;
  auto has = [&](const char* k) { return std::find(given.begin(), given.end(), k) != given.end(); };
  // (A d_model beyond 2^40 is left for validation to refuse: 8 x d_model must not overflow.)
  if (has("model.d_model") && !has("model.ffn") && m.d_model > 0 && m.d_model < (int64_t(1) << 40)) {
    if (m.arch == Arch::kGpt) {
      m.ffn = 4 * m.d_model;
      m.notes.push_back("model.ffn = " + std::to_string(m.ffn) + " (4 x d_model, GPT)");
    } else {
      m.ffn = (8 * m.d_model / 3 + 255) / 256 * 256;
      m.notes.push_back("model.ffn = " + std::to_string(m.ffn) + " (Llama: 8/3 x d_model rounded up to 256)");
    }
  }
  if (m.arch == Arch::kLlama && has("model.heads") && !has("model.kv_heads")) {
    m.kv_heads = m.heads;
    m.notes.push_back("model.kv_heads = " + std::to_string(m.kv_heads) + " (no GQA: = heads)");
  }
  const std::pair<const char*, std::string> values[] = {
      {"model.arch", m.arch == Arch::kGpt ? "gpt" : "llama"}, {"model.layers", std::to_string(m.layers)},
      {"model.d_model", std::to_string(m.d_model)},           {"model.heads", std::to_string(m.heads)},
      {"model.ffn", std::to_string(m.ffn)},                   {"model.vocab", std::to_string(m.vocab)},
      {"model.ctx", std::to_string(m.ctx)}};
  std::string kept;  // the keys the default preset still supplies (ffn is noted above when derived)
  for (const auto& [k, v] : values) {
    if (has(k) || (std::string_view(k) == "model.ffn" && has("model.d_model"))) continue;
    if (!kept.empty()) kept += ", ";
    kept += std::string(k) + " = " + v;
  }
  if (!kept.empty())
    m.notes.push_back(kept + " from the default preset '" + m.preset + "' (no model.preset named; set them or name one)");
}

}  // namespace loom
