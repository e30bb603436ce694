// The model presets: published shapes by name (model.preset).
#include <string>
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

}  // namespace loom
