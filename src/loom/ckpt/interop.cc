// Hugging Face safetensors export/import (declared in checkpoint.h; the tensors' names and
// layouts shared with the directories of ckpt/hf_dir.cc through ckpt/hf.h).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/data/tokenizer.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/hf.h"
#include "loom/core/safetensors.h"

namespace fs = std::filesystem;

namespace loom {

namespace {

// One HF tensor = rows [row0, row1) of a loom tensor, possibly transposed (GPT-2 Conv1D
// stores weights as (in, out)). 1-D tensors use rows as elements.
struct HfEntry {
  std::string hf, loom;
  int64_t row0 = 0, row1 = -1;  // -1: all rows
  bool transpose = false;
};

std::vector<HfEntry> hf_entries(const ModelConfig& m) {
  std::vector<HfEntry> e;
  if (m.arch == Arch::kGpt) {
    e.push_back({"transformer.wte.weight", "wte"});
    e.push_back({"transformer.wpe.weight", "wpe"});
    for (int l = 0; l < int(m.layers); l++) {
      const std::string h = "transformer.h." + std::to_string(l) + ".", p = "h." + std::to_string(l) + ".";
      e.push_back({h + "ln_1.weight", p + "norm1.w"});
      e.push_back({h + "ln_1.bias", p + "norm1.b"});
      e.push_back({h + "attn.c_attn.weight", p + "attn.qkv.w", 0, -1, true});
      e.push_back({h + "attn.c_attn.bias", p + "attn.qkv.b"});
      e.push_back({h + "attn.c_proj.weight", p + "attn.proj.w", 0, -1, true});
      e.push_back({h + "attn.c_proj.bias", p + "attn.proj.b"});
      e.push_back({h + "ln_2.weight", p + "norm2.w"});
      e.push_back({h + "ln_2.bias", p + "norm2.b"});
      e.push_back({h + "mlp.c_fc.weight", p + "mlp.fc.w", 0, -1, true});
      e.push_back({h + "mlp.c_fc.bias", p + "mlp.fc.b"});
      e.push_back({h + "mlp.c_proj.weight", p + "mlp.proj.w", 0, -1, true});
      e.push_back({h + "mlp.c_proj.bias", p + "mlp.proj.b"});
    }
    e.push_back({"transformer.ln_f.weight", "normf.w"});
    e.push_back({"transformer.ln_f.bias", "normf.b"});
    return e;
  }
  const int64_t hd = m.head_dim(), q = m.heads * hd, kv = m.kv_heads * hd, F = m.ffn;
  e.push_back({"model.embed_tokens.weight", "wte"});
  for (int l = 0; l < int(m.layers); l++) {
    const std::string h = "model.layers." + std::to_string(l) + ".", p = "h." + std::to_string(l) + ".";
    e.push_back({h + "input_layernorm.weight", p + "norm1.w"});
    e.push_back({h + "self_attn.q_proj.weight", p + "attn.qkv.w", 0, q});
    e.push_back({h + "self_attn.k_proj.weight", p + "attn.qkv.w", q, q + kv});
    e.push_back({h + "self_attn.v_proj.weight", p + "attn.qkv.w", q + kv, q + 2 * kv});
    e.push_back({h + "self_attn.o_proj.weight", p + "attn.proj.w"});
    e.push_back({h + "post_attention_layernorm.weight", p + "norm2.w"});
    e.push_back({h + "mlp.gate_proj.weight", p + "mlp.fc.w", 0, F});
    e.push_back({h + "mlp.up_proj.weight", p + "mlp.fc.w", F, 2 * F});
    e.push_back({h + "mlp.down_proj.weight", p + "mlp.proj.w"});
  }
  e.push_back({"model.norm.weight", "normf.w"});
  e.push_back({"lm_head.weight", "head.w"});
  return e;
}

// The (rows, cols) block of a loom tensor that entry `e` covers.
void block_dims(const ParamSpec& s, const HfEntry& e, int64_t& r0, int64_t& rows, int64_t& cols) {
  cols = s.shape.size() == 2 ? s.shape[1] : 1;
  r0 = e.row0;
  rows = (e.row1 < 0 ? s.shape[0] : e.row1) - e.row0;
}

}  // namespace

// The config keys that name files of the machine that wrote a checkpoint: not carried in an
// export, not taken from an import (a checkpoint is data; nothing in it is followed as a
// path). The built-in tokenizer's name is a name, not a path, and stays; checkpoint.dir
// and the offload settings (which need a directory) return to their defaults, so the
// config stays valid.
Config without_paths(Config c) {
  c.data.path.clear(), c.data.shards.clear();
  c.checkpoint.dir = CheckpointConfig{}.dir;
  c.offload = OffloadConfig{};
  if (c.data.tokenizer != "byte") c.data.tokenizer.clear();
  return c;
}

std::vector<std::string> hf_names(const ModelConfig& m) {
  std::vector<std::string> names;
  for (const HfEntry& e : hf_entries(m)) names.push_back(e.hf);
  return names;
}

StFile hf_tensors(const CheckpointData& ck, const std::string& dtype) {
  LOOM_CONFIG_CHECK(dtype == "fp32" || dtype == "bf16", "export --dtype '", dtype, "': expected fp32 or bf16");
  const ParamLayout layout(ck.config.model);
  StFile out;
  out.metadata = {{"format", "pt"},
                  {"loom_config", to_toml(without_paths(ck.config))},
                  {"torch_dtype", dtype == "bf16" ? "bfloat16" : "float32"}};
  for (const HfEntry& e : hf_entries(ck.config.model)) {
    const ParamSpec& s = layout.at(e.loom);
    int64_t r0, rows, cols;
    block_dims(s, e, r0, rows, cols);
    const float* src = ck.params.data() + s.offset + r0 * cols;
    std::vector<float> buf(size_t(rows * cols));
    std::vector<int64_t> shape;
    if (s.shape.size() == 1) {
      std::copy(src, src + rows, buf.begin());
      shape = {rows};
    } else if (e.transpose) {
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) buf[c * rows + r] = src[r * cols + c];
      shape = {cols, rows};
    } else {
      std::copy(src, src + rows * cols, buf.begin());
      shape = {rows, cols};
    }
    out.tensors[e.hf] = dtype == "bf16" ? make_bf16(shape, buf.data()) : make_f32(shape, buf.data());
  }
  return out;
}

void export_safetensors(const std::string& checkpoint_dir, const std::string& out_file, const std::string& dtype) {
  const StFile out = hf_tensors(load_checkpoint(checkpoint_dir), dtype);
  std::error_code ec;
  const fs::path parent = fs::absolute(out_file).parent_path();
  fs::create_directories(parent, ec);
  double bytes = 0;
  for (const auto& [name, t] : out.tensors) bytes += double(t.bytes.size());
  require_free_space(parent.string(), bytes, "the export '" + out_file + "'",
                     "free space, or pass --out on another file system (or --dtype bf16: half the bytes)");
  // Through a marked temporary directory: a killed export leaves nothing at --out, and the
  // next one there removes what it left (Note [Ownership by content]).
  owned::write_through_temp(out_file, [&](const std::string& tmp) { write_safetensors(tmp, out); });
}

namespace {

// Model keys readable from HF tensor shapes (heads are not: they come from the config).
void infer_shapes(const StFile& f, const std::string& path, ModelConfig& m) {
  const bool gpt = f.tensors.count("transformer.wte.weight") > 0;
  const bool llama = f.tensors.count("model.embed_tokens.weight") > 0;
  LOOM_CHECK(gpt || llama, "safetensors file '", path, "' has neither transformer.wte.weight (GPT-2) nor ",
             "model.embed_tokens.weight (Llama): not a GPT-2 or Llama checkpoint");
  m.arch = gpt ? Arch::kGpt : Arch::kLlama;
  const std::regex layer_re(gpt ? R"(transformer\.h\.(\d+)\..*)" : R"(model\.layers\.(\d+)\..*)");
  int64_t layers = 0;
  for (const auto& [name, t] : f.tensors) {
    std::smatch mt;
    if (std::regex_match(name, mt, layer_re)) layers = std::max<int64_t>(layers, std::stoll(mt[1]) + 1);
  }
  const auto& wte = f.at(gpt ? "transformer.wte.weight" : "model.embed_tokens.weight", path);
  LOOM_CHECK(wte.shape.size() == 2, "embedding in '", path, "' has shape ", shape_string(wte.shape), ", expected (vocab, d_model)");
  m.layers = layers, m.vocab = wte.shape[0], m.d_model = wte.shape[1];
  if (gpt) {
    m.ctx = f.at("transformer.wpe.weight", path).shape.at(0);
    m.ffn = f.at("transformer.h.0.mlp.c_fc.weight", path).shape.at(1);
  } else {
    m.ffn = f.at("model.layers.0.mlp.gate_proj.weight", path).shape.at(0);
    const int64_t kv_rows = f.at("model.layers.0.self_attn.k_proj.weight", path).shape.at(0);
    if (m.heads > 0 && m.d_model % m.heads == 0) m.kv_heads = kv_rows / (m.d_model / m.heads);
  }
  if (gpt) m.kv_heads = m.heads;
}

}  // namespace

void import_safetensors(const std::string& in_file, const std::string& checkpoint_dir, const Config& base,
                        bool base_given, const std::string& tokenizer) {
  const StFile f = read_safetensors(in_file);
  Config cfg = base;
  if (auto it = f.metadata.find("loom_config"); it != f.metadata.end() && !base_given) {
    cfg = config_from_toml_string(it->second);
    cfg = without_paths(cfg);  // nothing in a file is followed as a path
  } else {
    infer_shapes(f, in_file, cfg.model);
    cfg.model.preset = "custom";
    auto errs = validation_errors(cfg);
    if (!errs.empty())
      throw ConfigError("imported model from '" + in_file + "' gives an invalid config: " + errs.front() +
                        " (the file has no loom_config metadata; give model.heads/kv_heads with --set)");
  }
  import_tensors(f, in_file, cfg, checkpoint_dir, tokenizer);
}

void import_tensors(const StFile& f, const std::string& in_file, Config cfg, const std::string& checkpoint_dir,
                    const std::string& tokenizer) {
  if (!tokenizer.empty()) {
    const int64_t v = data::load_tokenizer(tokenizer)->vocab_size();
    LOOM_CONFIG_CHECK(v <= cfg.model.vocab, "--tokenizer '", tokenizer, "' has ", v,
                      " tokens but the imported model's vocabulary is ", cfg.model.vocab, ": not this model's tokenizer");
    cfg.data.tokenizer = tokenizer;
  }
  const ParamLayout layout(cfg.model);
  std::vector<float> params(layout.total_floats(), 0.0f);
  for (const HfEntry& e : hf_entries(cfg.model)) {
    const ParamSpec& s = layout.at(e.loom);
    int64_t r0, rows, cols;
    block_dims(s, e, r0, rows, cols);
    const StTensor& t = f.at(e.hf, in_file);
    std::vector<int64_t> want = s.shape.size() == 1 ? std::vector<int64_t>{rows}
                                : e.transpose        ? std::vector<int64_t>{cols, rows}
                                                     : std::vector<int64_t>{rows, cols};
    LOOM_CHECK(t.shape == want, "tensor '", e.hf, "' in '", in_file, "' has shape ", shape_string(t.shape),
               " but the model config needs ", shape_string(want));
    const std::vector<float> v = t.as_f32();
    const auto bad = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
    LOOM_CHECK(bad == v.end(), "tensor '", e.hf, "' in '", in_file, "' holds ",
               std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); }),
               " NaN or infinite values (the first at flat index ", bad - v.begin(), ": ", *bad,
               "): loom imports only finite weights; nothing was written");
    float* dst = params.data() + s.offset + r0 * cols;
    if (e.transpose && s.shape.size() == 2) {
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = v[c * rows + r];
    } else {
      std::copy(v.begin(), v.end(), dst);
    }
  }
  cfg.checkpoint.dir = checkpoint_dir;
  save_checkpoint(checkpoint_dir, cfg, layout, params, nullptr, nullptr, CheckpointState{});
}

}  // namespace loom
