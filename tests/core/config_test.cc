#include <gtest/gtest.h>

#include <fstream>

#include "loom/core/config.h"
#include "loom/core/error.h"

namespace loom {
namespace {

std::string error_of(const std::vector<std::string>& sets, const std::string& toml = "") {
  try {
    if (toml.empty()) load_config("", sets);
    else config_from_toml_string(toml, sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultIsTinyAndValid) {
  Config c = load_config("", {});
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.vocab, 256);
  EXPECT_TRUE(validation_errors(c).empty());
}

TEST(Config, PresetSetsEveryModelKeyAndExplicitKeysOverride) {
  Config c = load_config("", {"model.preset=gpt2", "model.layers=2"});
  EXPECT_EQ(c.model.d_model, 768);
  EXPECT_EQ(c.model.vocab, 50257);
  EXPECT_EQ(c.model.layers, 2);
  Config l = load_config("", {"model.preset=llama"});
  EXPECT_EQ(l.model.arch, Arch::kLlama);
  EXPECT_EQ(l.model.kv_heads, 2);
  // Order does not matter: the preset applies first.
  Config o = load_config("", {"model.layers=3", "model.preset=gpt2-medium"});
  EXPECT_EQ(o.model.layers, 3);
  EXPECT_EQ(o.model.d_model, 1024);
}

TEST(Config, GptKvHeadsFollowHeads) {
  Config c = load_config("", {"model.heads=8"});
  EXPECT_EQ(c.model.kv_heads, 8);
}

TEST(Config, UnknownKeysAndSectionsAreNamed) {
  EXPECT_NE(error_of({"model.layyers=3"}).find("unknown config key 'model.layyers'"), std::string::npos);
  EXPECT_NE(error_of({"model.layyers=3"}).find("layers"), std::string::npos);  // lists known keys
  EXPECT_NE(error_of({"modle.layers=3"}).find("unknown config section 'modle'"), std::string::npos);
  EXPECT_NE(error_of({"train.steps"}).find("expected section.key=value"), std::string::npos);
  EXPECT_NE(error_of({}, "[model]\nbogus = 1\n").find("model.bogus"), std::string::npos);
}

TEST(Config, TypeErrorsNameTheValueAndTheExpectedForm) {
  EXPECT_NE(error_of({"train.steps=ten"}).find("'train.steps' = 'ten': expected an integer"), std::string::npos);
  EXPECT_NE(error_of({"optim.lr=fast"}).find("expected a finite number"), std::string::npos);
  EXPECT_NE(error_of({}, "[train]\nsteps = \"10\"\n").find("expected an integer"), std::string::npos);
  EXPECT_NE(error_of({"model.preset=huge"}).find("expected one of tiny"), std::string::npos);
}

TEST(Config, ValidationListsEveryViolation) {
  std::string e = error_of({"model.heads=5", "train.batch=0", "optim.lr=-1"});
  EXPECT_NE(e.find("model.heads = 5 does not divide model.d_model = 128"), std::string::npos) << e;
  EXPECT_NE(e.find("train.batch = 0: expected a positive integer"), std::string::npos) << e;
  EXPECT_NE(e.find("optim.lr = -1"), std::string::npos) << e;
  EXPECT_NE(error_of({"model.layers=-2"}).find("model.layers = -2"), std::string::npos);
  EXPECT_NE(error_of({"train.grad_accum=3"}).find("does not divide train.batch = 16"), std::string::npos);
  EXPECT_NE(error_of({"model.vocab=100"}).find("vocab >= 256"), std::string::npos);
  EXPECT_NE(error_of({"model.preset=llama", "model.kv_heads=3"}).find("kv_heads = 3 does not divide"), std::string::npos);
  EXPECT_NE(error_of({"train.seq=1000"}).find("exceeds model.ctx = 128"), std::string::npos);
}

TEST(Config, TomlRoundTrip) {
  Config c = load_config("", {"model.preset=llama", "optim.lr=0.0003", "data.path=/x y", "train.steps=7"});
  Config d = config_from_toml_string(to_toml(c));
  EXPECT_EQ(to_toml(c), to_toml(d));
  EXPECT_EQ(d.optim.lr, 0.0003);
  EXPECT_EQ(d.data.path, "/x y");
  EXPECT_EQ(d.train.steps, 7);
}

TEST(Config, FileSyntaxErrorNamesLine) {
  const std::string path = ::testing::TempDir() + "/bad.toml";
  std::ofstream(path) << "[train]\nsteps = 10\nbatch = = 3\n";
  try {
    load_config(path, {});
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_config("/nonexistent/loom.toml", {}), ConfigError);
}

}  // namespace
}  // namespace loom
