// Hugging Face model directories (Note [Hugging Face directories]): export with config.json
// and shards, import from config.json alone, and the refusals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/safetensors.h"
#include "loom/model/layout.h"
#include "loom/train/sampler.h"
#include "loom/train/trainer.h"
#include "support/temp_dir.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_support::TempDir;

// A trained checkpoint of a small GPT-2 or Llama at dir/ck.
std::string trained(const TempDir& dir, bool llama) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.ffn=256",
                                   "model.ctx=32", "train.batch=4", "train.steps=3", "train.val_every=0",
                                   "train.val_batches=1", "train.threads=1", "checkpoint.dir=" + (dir / "ck")};
  if (llama) sets.insert(sets.end(), {"model.arch=llama", "model.kv_heads=2", "model.ffn=128", "model.rope_theta=500000"});
  TrainOptions o;
  std::ostringstream sink;
  o.out = o.err = &sink;
  train(load_config("", sets), o);
  return dir / "ck";
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

// Every shard of `hf` rewritten without loom's metadata (a directory as another tool wrote it).
void strip_loom_metadata(const std::string& hf) {
  for (const auto& e : fs::directory_iterator(hf)) {
    if (e.path().extension() != ".safetensors") continue;
    StFile f = read_safetensors(e.path().string());
    f.metadata.erase("loom_config");
    write_safetensors(e.path().string(), f);
  }
}

TEST(HfDirectory, ShardedExportImportsBackBitForBitWithoutFlags) {
  for (const bool llama : {false, true}) {
    TempDir dir("loom-hf");
    const std::string ck = trained(dir, llama), hf = dir / "hf", back = dir / "back";
    export_hf_dir(ck, hf, "fp32", 0.05);  // 50 KiB shards: the blocks' weights split the model
    const json index = read_json(hf + "/model.safetensors.index.json");
    std::set<std::string> shards;
    for (const auto& [t, s] : index["weight_map"].items()) shards.insert(s.get<std::string>());
    EXPECT_GE(shards.size(), 2u);
    EXPECT_FALSE(fs::exists(hf + "/model.safetensors"));
    for (const std::string& s : shards) EXPECT_TRUE(fs::is_regular_file(hf + "/" + s)) << s;
    const json cfg = read_json(hf + "/config.json");
    EXPECT_EQ(cfg["model_type"], llama ? "llama" : "gpt2");
    EXPECT_EQ(cfg[llama ? "num_hidden_layers" : "n_layer"], 2);
    EXPECT_EQ(cfg[llama ? "hidden_size" : "n_embd"], 64);
    if (llama) EXPECT_EQ(cfg["num_key_value_heads"], 2);

    import_hf_dir(hf, back, Config{}, false);
    EXPECT_EQ(load_checkpoint(back).params, load_checkpoint(ck).params);
    SampleOptions so;
    so.prompt = "The ", so.tokens = 8, so.temperature = 0;
    EXPECT_EQ(sample(ck, so), sample(back, so));
  }
}

TEST(HfDirectory, ConfigJsonAloneGivesTheModel) {
  for (const bool llama : {false, true}) {
    TempDir dir("loom-hf");
    const std::string ck = trained(dir, llama), hf = dir / "hf", back = dir / "back";
    export_hf_dir(ck, hf, "bf16", 1000);  // one file
    ASSERT_TRUE(fs::exists(hf + "/model.safetensors"));
    strip_loom_metadata(hf);
    import_hf_dir(hf, back, Config{}, false);
    const ModelConfig want = load_checkpoint(ck).config.model, got = load_checkpoint(back).config.model;
    EXPECT_EQ(got.arch, want.arch);
    EXPECT_EQ(got.layers, want.layers);
    EXPECT_EQ(got.d_model, want.d_model);
    EXPECT_EQ(got.heads, want.heads);
    EXPECT_EQ(got.kv_heads, want.kv_heads);
    EXPECT_EQ(got.ffn, want.ffn);
    EXPECT_EQ(got.vocab, want.vocab);
    EXPECT_EQ(got.ctx, want.ctx);
    EXPECT_EQ(got.norm_eps, want.norm_eps);
    EXPECT_EQ(got.rope_theta, want.rope_theta);
    // The bf16 weights widened exactly: each is the fp32 master rounded to nearest-even.
    const std::vector<float> a = load_checkpoint(ck).params, b = load_checkpoint(back).params;
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); i++) ASSERT_NEAR(b[i], a[i], std::abs(a[i]) / 256 + 1e-30) << i;
  }
}

// Llama with tie_word_embeddings (Llama 3.2 1B / 3B): no lm_head.weight in the files.
TEST(HfDirectory, TiedLlamaStartsItsHeadFromTheEmbedding) {
  TempDir dir("loom-hf");
  const std::string ck = trained(dir, true), hf = dir / "hf", back = dir / "back";
  export_hf_dir(ck, hf, "fp32", 1000);
  StFile f = read_safetensors(hf + "/model.safetensors");
  f.tensors.erase("lm_head.weight");
  f.metadata.erase("loom_config");
  write_safetensors(hf + "/model.safetensors", f);
  json cfg = read_json(hf + "/config.json");
  cfg["tie_word_embeddings"] = true;
  std::ofstream(hf + "/config.json") << cfg.dump();
  import_hf_dir(hf, back, Config{}, false);
  const CheckpointData got = load_checkpoint(back);
  const ParamLayout layout(got.config.model);
  const ParamSpec &wte = layout.at("wte"), &head = layout.at("head.w");
  ASSERT_EQ(wte.numel, head.numel);
  EXPECT_TRUE(std::equal(got.params.begin() + wte.offset, got.params.begin() + wte.offset + wte.numel,
                         got.params.begin() + head.offset));
}

// What loom cannot run is refused by name, before anything is written.
TEST(HfDirectory, RefusesWhatLoomCannotRunNamingTheKey) {
  TempDir dir("loom-hf");
  const std::string ck = trained(dir, true), hf = dir / "hf";
  export_hf_dir(ck, hf, "fp32", 1000);
  const json good = read_json(hf + "/config.json");
  auto refused = [&](const std::function<void(json&)>& edit, const std::string& says) {
    json c = good;
    edit(c);
    std::ofstream(hf + "/config.json") << c.dump();
    strip_loom_metadata(hf);
    const std::string back = dir / "back";
    try {
      import_hf_dir(hf, back, Config{}, false);
      ADD_FAILURE() << "accepted: " << c.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(back));
  };
  refused([](json& c) { c["model_type"] = "mistral"; }, "model_type \"mistral\"");
  refused([](json& c) { c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; }, "rope_scaling");
  refused([](json& c) { c["hidden_act"] = "gelu"; }, "hidden_act");
  refused([](json& c) { c["attention_bias"] = true; }, "attention_bias");
  refused([](json& c) { c.erase("hidden_size"); }, "hidden_size");
  refused([](json& c) { c["num_hidden_layers"] = -2; }, "num_hidden_layers");

  // A shard named outside the directory is never read.
  TempDir dir2("loom-hf");
  const std::string hf2 = dir2 / "hf";
  export_hf_dir(ck, hf2, "fp32", 0.05);
  json index = read_json(hf2 + "/model.safetensors.index.json");
  index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  std::ofstream(hf2 + "/model.safetensors.index.json") << index.dump();
  EXPECT_THROW(import_hf_dir(hf2, dir2 / "back", Config{}, false), Error);
}

// An export never replaces what is at --out: a file, or a directory holding anything.
TEST(HfDirectory, ExportWritesOnlyANewOrEmptyDirectory) {
  TempDir dir("loom-hf");
  const std::string ck = trained(dir, false);
  fs::create_directories(dir / "busy");
  std::ofstream(dir / "busy/notes.txt") << "mine";
  EXPECT_THROW(export_hf_dir(ck, dir / "busy", "fp32", 1000), ConfigError);
  EXPECT_TRUE(fs::exists(dir / "busy/notes.txt"));
  std::ofstream(dir / "a_file") << "mine";
  EXPECT_THROW(export_hf_dir(ck, dir / "a_file", "fp32", 1000), ConfigError);
  fs::create_directories(dir / "empty");
  export_hf_dir(ck, dir / "empty", "fp32", 1000);
  EXPECT_TRUE(fs::exists(dir / "empty/config.json"));
  for (const auto& e : fs::directory_iterator(dir.path))  // no marked temporaries left
    EXPECT_EQ(e.path().filename().string().find(".loom-tmp-"), std::string::npos) << e.path();
}

// A checkpoint's config names its tokenizer by path; the export copies it only when it loads
// as a tokenizer, so a config naming any other file carries nothing of it out.
TEST(HfDirectory, ExportCopiesOnlyATokenizerThatLoads) {
  TempDir dir("loom-hf");
  std::ofstream(dir / "secret.json") << "{\"password\": \"hunter2\"}\n";
  Config cfg = load_config("", {"model.layers=1", "model.d_model=32", "model.heads=2", "model.ffn=64", "model.ctx=16"});
  cfg.data.tokenizer = dir / "secret.json";
  const ParamLayout layout(cfg.model);
  save_checkpoint(dir / "ck", cfg, layout, std::vector<float>(size_t(layout.total_floats()), 0.01f), nullptr, nullptr,
                  CheckpointState{});
  const std::string what = export_hf_dir(dir / "ck", dir / "hf", "fp32", 1000);
  EXPECT_NE(what.find("does not load"), std::string::npos) << what;
  for (const auto& e : fs::directory_iterator(dir / "hf")) {
    std::ifstream f(e.path());
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    EXPECT_EQ(bytes.find("hunter2"), std::string::npos) << e.path();
  }
  EXPECT_FALSE(fs::exists(dir / "hf/tokenizer.json"));
}

}  // namespace
}  // namespace loom
