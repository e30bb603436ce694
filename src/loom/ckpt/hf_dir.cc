// Hugging Face model directories (declared in checkpoint.h): config.json, the weights in one
// file or shards with an index, the tokenizer files.
//
// Note [Hugging Face directories]
// `loom export --out DIR` (an --out not ending in .safetensors) writes the directory that
// transformers' from_pretrained reads: config.json with GPT2Config's or LlamaConfig's own
// key names (hf_config), the weights as model.safetensors or, when they pass
// --max-shard-mb, as model-0000i-of-0000N.safetensors (tensors in export order; a shard is
// closed before the tensor that would take it past the cap, and a tensor larger than the
// cap has a shard alone) with model.safetensors.index.json ({"metadata": {"total_size":
// bytes}, "weight_map": {tensor: shard}}), and the tokenizer files the checkpoint's
// data.tokenizer names. The directory is built in a marked temporary beside DIR and renamed
// into place, so a killed export leaves nothing at DIR; an existing DIR must be empty (a
// user's files are never replaced).
// `loom import --in DIR` takes the model from config.json (transformers' defaults where a
// key is absent; what loom cannot run - another activation, rope scaling, biases in
// Llama - is refused by name), the tensors from the index's shards or the one file (shard
// names are plain names inside DIR, never paths followed elsewhere), and DIR's tokenizer
// when it holds one. Llama with tie_word_embeddings has no lm_head.weight: the head starts
// as a copy of the embedding (loom trains the two apart).
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/hf.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/data/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace loom {

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";

json hf_config(const ModelConfig& m, const std::string& torch_dtype) {
  json j;
  if (m.arch == Arch::kGpt) {
    j = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", m.vocab},
         {"n_positions", m.ctx}, {"n_ctx", m.ctx}, {"n_embd", m.d_model}, {"n_layer", m.layers},
         {"n_head", m.heads}, {"n_inner", m.ffn}, {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", m.norm_eps}, {"initializer_range", m.init_std}, {"tie_word_embeddings", true},
         {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}};
  } else {
    j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", m.vocab},
         {"hidden_size", m.d_model}, {"intermediate_size", m.ffn}, {"num_hidden_layers", m.layers},
         {"num_attention_heads", m.heads}, {"num_key_value_heads", m.kv_heads},
         {"max_position_embeddings", m.ctx}, {"rms_norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta},
         {"hidden_act", "silu"}, {"initializer_range", m.init_std}, {"tie_word_embeddings", false},
         {"attention_bias", false}, {"mlp_bias", false}};
  }
  j["torch_dtype"] = torch_dtype;
  j["loom_export"] = true;
  return j;
}

// config.json's integer `key` (transformers' default `dflt` when absent).
int64_t int_key(const json& j, const std::string& key, const std::string& path, std::optional<int64_t> dflt = {}) {
  if (!j.contains(key) || j[key].is_null()) {
    LOOM_CONFIG_CHECK(dflt.has_value(), path, " has no \"", key, "\", which the model needs");
    return *dflt;
  }
  LOOM_CONFIG_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() > 0, path, ": \"", key, "\" is ", j[key].dump(),
                    ", expected a positive integer");
  return j[key].get<int64_t>();
}

double real_key(const json& j, const std::string& key, double dflt, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  LOOM_CONFIG_CHECK(j[key].is_number() && j[key].get<double>() > 0, path, ": \"", key, "\" is ", j[key].dump(),
                    ", expected a positive number");
  return j[key].get<double>();
}

// `key` absent, or one of `ok` (what loom runs); refused by name otherwise.
void require_value(const json& j, const std::string& key, const std::vector<json>& ok, const std::string& path,
                   const std::string& why) {
  if (!j.contains(key) || j[key].is_null()) return;
  for (const json& v : ok)
    if (j[key] == v) return;
  throw ConfigError(path + ": \"" + key + "\" is " + j[key].dump() + "; " + why);
}

}  // namespace

ModelConfig model_from_hf_config(const std::string& path) {
  json j;
  try {
    j = json::parse(owned::read_regular(path, size_t(1) << 20));
  } catch (const json::exception& e) {
    throw ConfigError(path + " is not JSON: " + e.what());
  }
  LOOM_CONFIG_CHECK(j.is_object() && j.contains("model_type") && j["model_type"].is_string(), path,
                    " has no \"model_type\": not a transformers config.json");
  const std::string type = j["model_type"];
  ModelConfig m;
  m.preset = "custom";
  if (type == "gpt2") {
    m.arch = Arch::kGpt;
    m.vocab = int_key(j, "vocab_size", path), m.d_model = int_key(j, "n_embd", path);
    m.layers = int_key(j, "n_layer", path), m.heads = int_key(j, "n_head", path), m.kv_heads = m.heads;
    m.ctx = int_key(j, "n_positions", path, j.contains("n_ctx") ? std::optional<int64_t>(int_key(j, "n_ctx", path))
                                                                 : std::nullopt);
    m.ffn = int_key(j, "n_inner", path, 4 * m.d_model);
    m.norm_eps = real_key(j, "layer_norm_epsilon", 1e-5, path);
    require_value(j, "activation_function", {"gelu_new", "gelu_pytorch_tanh"}, path,
                  "loom's GPT-2 uses the tanh GELU (gelu_new)");
    require_value(j, "tie_word_embeddings", {true}, path, "loom's GPT-2 ties its head to wte");
  } else if (type == "llama") {
    m.arch = Arch::kLlama;
    m.vocab = int_key(j, "vocab_size", path), m.d_model = int_key(j, "hidden_size", path);
    m.layers = int_key(j, "num_hidden_layers", path), m.heads = int_key(j, "num_attention_heads", path);
    m.kv_heads = int_key(j, "num_key_value_heads", path, m.heads);
    m.ffn = int_key(j, "intermediate_size", path), m.ctx = int_key(j, "max_position_embeddings", path);
    m.norm_eps = real_key(j, "rms_norm_eps", 1e-6, path);
    m.rope_theta = real_key(j, "rope_theta", 10000.0, path);
    require_value(j, "hidden_act", {"silu"}, path, "loom's Llama uses SwiGLU with SiLU");
    require_value(j, "rope_scaling", {}, path, "loom's RoPE has no scaling (Llama 3.1's long-context rope_scaling "
                                               "is not built); remove the key to import with plain RoPE");
    require_value(j, "attention_bias", {false}, path, "loom's Llama has no attention biases");
    require_value(j, "mlp_bias", {false}, path, "loom's Llama has no MLP biases");
  } else {
    throw ConfigError(path + ": model_type \"" + type + "\"; loom imports gpt2 and llama");
  }
  m.init_std = real_key(j, "initializer_range", 0.02, path);
  return m;
}

namespace {

// The tensors of an HF directory: the index's shards, or model.safetensors.
StFile read_hf_weights(const std::string& dir) {
  const fs::path index = fs::path(dir) / kIndex;
  if (owned::kind_of(index.string()) == owned::Kind::kNone) {
    const std::string one = (fs::path(dir) / "model.safetensors").string();
    LOOM_CONFIG_CHECK(owned::kind_of(one) != owned::Kind::kNone, "--in '", dir, "' holds neither ", kIndex,
                      " nor model.safetensors");
    return read_safetensors(one);
  }
  json j;
  try {
    j = json::parse(owned::read_regular(index.string(), size_t(64) << 20));
  } catch (const json::exception& e) {
    throw ConfigError(index.string() + " is not JSON: " + e.what());
  }
  LOOM_CONFIG_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index.string(), " has no \"weight_map\"");
  std::map<std::string, std::set<std::string>> by_shard;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    LOOM_CONFIG_CHECK(shard.is_string(), index.string(), ": tensor '", tensor, "' maps to ", shard.dump());
    const std::string name = shard.get<std::string>();
    LOOM_CONFIG_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
                      index.string(), ": shard '", name, "' of tensor '", tensor,
                      "' is not a plain file name in the directory (shards are never looked for elsewhere)");
    by_shard[name].insert(tensor);
  }
  StFile all;
  for (const auto& [name, tensors] : by_shard) {
    const std::string path = (fs::path(dir) / name).string();
    StFile shard = read_safetensors(path);
    if (all.metadata.empty()) all.metadata = shard.metadata;
    for (const std::string& t : tensors) {
      auto it = shard.tensors.find(t);
      LOOM_CHECK(it != shard.tensors.end(), index.string(), " puts tensor '", t, "' in ", name, ", which lacks it");
      all.tensors[t] = std::move(it->second);
    }
  }
  return all;
}

// The tokenizer the checkpoint's data.tokenizer names, copied into `out` under transformers'
// names; returns what was done, for the user. The path comes from a checkpoint's config, so
// its files are copied only when they load as that tokenizer (loom's own loader) - nothing
// else a config names is carried out of the machine - and only the tokenizer file names.
std::string copy_tokenizer(const std::string& name, const fs::path& out) {
  if (name.empty() || name == "byte") return "the byte tokenizer (nothing to copy)";
  if (owned::kind_of(name) == owned::Kind::kNone) return "tokenizer '" + name + "' is no longer there: not copied";
  try {
    data::load_tokenizer(name);
  } catch (const Error& e) {
    return "tokenizer '" + name + "' does not load (" + e.what() + "): not copied";
  }
  std::vector<std::pair<fs::path, std::string>> files;
  if (fs::is_directory(name)) {
    for (const char* f : {"tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt"})
      if (fs::is_regular_file(fs::path(name) / f)) files.push_back({fs::path(name) / f, f});
  } else {
    files.push_back({name, fs::path(name).extension() == ".model" ? "tokenizer.model" : "tokenizer.json"});
  }
  std::string copied;
  for (const auto& [from, to] : files) {
    write_file_atomic((out / to).string(), owned::read_regular(from.string(), size_t(1) << 30));
    copied += (copied.empty() ? "" : ", ") + to;
  }
  return "tokenizer: " + copied;
}

// Splits the tensors into shards of at most `cap` bytes (in `order`); one shard when all fit.
std::vector<StFile> shard_tensors(StFile all, const std::vector<std::string>& order, double cap) {
  std::vector<StFile> shards(1);
  double in_shard = 0;
  for (const std::string& name : order) {
    StTensor& t = all.tensors.at(name);
    const double b = double(t.bytes.size());
    if (in_shard > 0 && in_shard + b > cap) shards.emplace_back(), in_shard = 0;
    shards.back().metadata = all.metadata;
    shards.back().tensors[name] = std::move(t);
    in_shard += b;
  }
  return shards;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

std::string export_hf_dir(const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
                          double max_shard_mb) {
  LOOM_CONFIG_CHECK(max_shard_mb > 0, "export --max-shard-mb ", max_shard_mb, ": expected a positive size in MiB");
  const owned::Kind k = owned::kind_of(out_dir);
  LOOM_CONFIG_CHECK(k == owned::Kind::kNone || (k == owned::Kind::kDir && fs::is_empty(out_dir)),
                    "export --out '", out_dir, "' is ", owned::kind_text(k),
                    k == owned::Kind::kDir ? " that is not empty" : "",
                    ": loom writes a model directory only at a new path or into an empty directory; choose another "
                    "--out (or end it in .safetensors for one file)");
  const CheckpointData ck = load_checkpoint(checkpoint_dir);
  StFile all = hf_tensors(ck, dtype);
  double bytes = 0;
  for (const auto& [name, t] : all.tensors) bytes += double(t.bytes.size());
  const fs::path dest = fs::absolute(out_dir);
  fs::create_directories(dest.parent_path());
  require_free_space(dest.parent_path().string(), bytes, "the export '" + out_dir + "'",
                     "free space, or pass --out on another file system (or --dtype bf16: half the bytes)");
  const std::vector<StFile> shards = shard_tensors(std::move(all), hf_names(ck.config.model), max_shard_mb * (1 << 20));
  owned::TempDir tmp(dest.parent_path().string(), dest.filename().string());
  const fs::path at(tmp.path());
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); i++) {
    const std::string name = shards.size() == 1 ? "model.safetensors" : shard_name(i, shards.size());
    write_safetensors((at / name).string(), shards[i]);
    for (const auto& [t, _] : shards[i].tensors) weight_map[t] = name;
  }
  if (shards.size() > 1)
    write_file_atomic((at / kIndex).string(),
                      json{{"metadata", {{"total_size", int64_t(bytes)}}}, {"weight_map", weight_map}}.dump(2) + "\n");
  write_file_atomic((at / "config.json").string(),
                    hf_config(ck.config.model, dtype == "bf16" ? "bfloat16" : "float32").dump(2) + "\n");
  const std::string tokenizer = copy_tokenizer(ck.config.data.tokenizer, at);
  if (k == owned::Kind::kDir) fs::remove(dest);  // empty, checked above
  tmp.publish(dest.string());
  return std::to_string(shards.size()) + (shards.size() == 1 ? " weights file; " : " shards; ") + tokenizer;
}

void import_hf_dir(const std::string& in_dir, const std::string& checkpoint_dir, const Config& base, bool base_given,
                   const std::string& tokenizer) {
  const std::string config_path = (fs::path(in_dir) / "config.json").string();
  Config cfg = base;
  StFile f = read_hf_weights(in_dir);
  if (auto it = f.metadata.find("loom_config"); it != f.metadata.end() && !base_given) {
    cfg = without_paths(config_from_toml_string(it->second));  // a loom export: its whole config
  } else {
    LOOM_CONFIG_CHECK(owned::kind_of(config_path) != owned::Kind::kNone, "--in '", in_dir,
                      "' has no config.json: not a Hugging Face model directory");
    cfg.model = model_from_hf_config(config_path);
    if (const auto errs = validation_errors(cfg); !errs.empty())
      throw ConfigError("the model of " + config_path + " gives an invalid config: " + errs.front());
  }
  if (cfg.model.arch == Arch::kLlama && !f.tensors.count("lm_head.weight") && f.tensors.count("model.embed_tokens.weight"))
    f.tensors["lm_head.weight"] = f.tensors.at("model.embed_tokens.weight");  // tie_word_embeddings
  std::string tok = tokenizer;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "vocab.json"})
    if (tok.empty() && fs::is_regular_file(fs::path(in_dir) / name)) tok = in_dir;
  import_tensors(f, in_dir, cfg, checkpoint_dir, tok);
}

}  // namespace loom
