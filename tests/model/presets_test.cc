// Model presets against published parameter counts: the layout table (which the engine
// trains and the simulator will size) must reproduce them.
#include <gtest/gtest.h>

#include <cmath>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/model/layout.h"

namespace loom {
namespace {

int64_t params_of(const std::string& preset) {
  ModelConfig m;
  apply_model_preset(m, preset);
  return ParamLayout(m).param_count();
}

TEST(Presets, LlamaMatchesTheReleasedCheckpointsExactly) {
  // Parameter counts of Meta's released checkpoints (Hugging Face model cards / safetensors).
  EXPECT_EQ(params_of("llama2-7b"), 6'738'415'616);
  EXPECT_EQ(params_of("llama2-13b"), 13'015'864'320);
  EXPECT_EQ(params_of("llama2-70b"), 68'976'648'192);
  EXPECT_EQ(params_of("llama3-8b"), 8'030'261'248);
  EXPECT_EQ(params_of("llama3-70b"), 70'553'706'496);
  EXPECT_EQ(params_of("llama3-405b"), 405'853'388'800);
}

TEST(Presets, MegatronGptFamilyRoundsToThePublishedSizes) {
  // ../shared/reference/published_runs.csv rows 1-10 (params_b, as published: the count in
  // billions rounded to the digits shown), GPT-3 175B and Korthikanti's 22B.
  const std::pair<const char*, double> published[] = {
      {"gpt-1.7b", 1.7},    {"gpt-3.6b", 3.6},   {"gpt-7.5b", 7.5},   {"gpt-18b", 18.4},
      {"gpt-39b", 39.1},    {"gpt-76b", 76.1},   {"gpt-145b", 145.6}, {"gpt-310b", 310.1},
      {"gpt-530b", 529.6},  {"gpt-1t", 1008.0},  {"gpt3-175b", 175},  {"gpt-22b", 22}};
  for (auto [name, billions] : published) {
    const double got = double(params_of(name)) / 1e9;
    // The published figure's last digit: one decimal when it has one, else units.
    const double unit = std::floor(billions) == billions && billions >= 20 ? 1.0 : 0.1;
    EXPECT_NEAR(got, billions, unit / 2) << name << ": " << got << " B";
  }
}

TEST(Presets, EveryPresetIsValidAndNamedInErrors) {
  for (const std::string& name : model_preset_names()) {
    Config c = load_config("", {"model.preset=" + name});
    EXPECT_TRUE(validation_errors(c).empty()) << name;
  }
  try {
    load_config("", {"model.preset=llama4"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("llama3-405b"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom
