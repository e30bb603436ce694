// Note [Checkpoint directory ownership]: what survey_dir calls loom's and what it calls the
// user's, the lock, and moving a run aside.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/run_dir.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "/run_dir_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(RunDir, SurveyTellsLoomsEntriesFromTheUsers) {
  const std::string d = fresh("survey");
  fs::create_directories(d + "/step-00000010");
  std::ofstream(d + "/step-00000010/manifest.json") << "{}";
  fs::create_directories(d + "/step-00000020");       // no manifest: not a step loom finished
  fs::create_directories(d + "/step-00000030.tmp");   // an unfinished save
  fs::create_directories(d + "/replaced-20261123T000000Z");
  std::ofstream(d + "/latest") << "step-00000010\n";
  std::ofstream(d + "/loom.lock") << "pid 1 on x\n";
  std::ofstream(d + "/config.toml") << "[model]\n";  // a user's config.toml: no loom model.safetensors beside it
  std::ofstream(d + "/notes.txt") << "mine";
  const DirSurvey s = survey_dir(d);
  EXPECT_TRUE(s.exists);
  EXPECT_EQ(s.steps, std::vector<int64_t>{10});
  EXPECT_EQ(s.stale, std::vector<std::string>{"step-00000030.tmp"});
  EXPECT_EQ(s.replaced, std::vector<std::string>{"replaced-20261123T000000Z"});
  EXPECT_TRUE(s.latest);
  EXPECT_FALSE(s.whole);
  EXPECT_EQ(s.foreign, (std::vector<std::string>{"config.toml", "notes.txt", "step-00000020"}));
  try {
    refuse_foreign(s, "checkpoint.dir");
    FAIL() << "foreign entries accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("3 entries loom did not write ('config.toml', 'notes.txt', 'step-00000020')"),
              std::string::npos) << e.what();
  }
  EXPECT_FALSE(survey_dir(d + "/absent").exists);
  EXPECT_THROW(survey_dir(d + "/notes.txt"), ConfigError);  // a file where a directory belongs
}

TEST(RunDir, AWholeModelCheckpointIsLoomsOnlyWithItsTag) {
  const std::string d = fresh("whole");
  const Config c = load_config("", {"model.layers=1", "model.d_model=32", "model.heads=2", "model.ffn=64",
                                    "model.ctx=16"});
  const ParamLayout layout(c.model);
  const std::vector<float> params(size_t(layout.total_floats()), 0.5f);
  save_checkpoint(d + "/ck", c, layout, params, nullptr, nullptr, {});
  const DirSurvey s = survey_dir(d + "/ck");
  EXPECT_TRUE(s.whole);
  EXPECT_TRUE(s.foreign.empty());
  EXPECT_TRUE(s.holds_checkpoints());
  EXPECT_NE(describe_newest(s).find("a whole-model checkpoint at step 0 (model gpt"), std::string::npos)
      << describe_newest(s);
  // Saving again over it replaces it (loom's own); over a user's file it refuses.
  save_checkpoint(d + "/ck", c, layout, params, nullptr, nullptr, {});
  std::ofstream(d + "/ck/thesis.txt") << "mine";
  EXPECT_THROW(save_checkpoint(d + "/ck", c, layout, params, nullptr, nullptr, {}), ConfigError);
  EXPECT_TRUE(fs::exists(d + "/ck/thesis.txt"));
  // A model.safetensors without loom's tag makes the four names the user's.
  std::ofstream(d + "/other.safetensors") << "x";
  fs::create_directories(d + "/user");
  std::ofstream(d + "/user/config.toml") << "x";
  std::ofstream(d + "/user/model.safetensors") << std::string(8, '\0');
  EXPECT_EQ(survey_dir(d + "/user").foreign, (std::vector<std::string>{"config.toml", "model.safetensors"}));
}

TEST(RunDir, OneJobHoldsTheLockAndMovingAsideDeletesNothing) {
  const std::string d = fresh("lock");
  {
    const DirLock held(d);
    try {
      const DirLock second(d);
      FAIL() << "two holders";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("in use by another loom job (pid "), std::string::npos) << e.what();
    }
  }
  const DirLock again(d);  // released with its holder
  fs::create_directories(d + "/step-00000004");
  std::ofstream(d + "/step-00000004/manifest.json") << "{}";
  std::ofstream(d + "/latest") << "step-00000004\n";
  const std::string to = move_aside(survey_dir(d));
  EXPECT_TRUE(fs::exists(to + "/step-00000004/manifest.json"));
  EXPECT_TRUE(fs::exists(to + "/latest"));
  EXPECT_FALSE(survey_dir(d).holds_checkpoints());
  EXPECT_EQ(survey_dir(d).replaced.size(), 1u);
}

TEST(RunDir, OutputFilesAreCheckedWithoutTouchingThem) {
  const std::string d = fresh("out");
  EXPECT_NO_THROW(check_output_file(d + "/trace.json", "--trace"));
  EXPECT_FALSE(fs::exists(d + "/trace.json"));  // the probe leaves nothing behind
  EXPECT_TRUE(fs::is_empty(d));
  EXPECT_THROW(check_output_file(d, "--trace"), ConfigError);                 // a directory
  EXPECT_THROW(check_output_file(d + "/no/such/t.json", "--trace"), ConfigError);
  EXPECT_THROW(check_output_file("/proc/loom-trace.json", "--trace"), ConfigError);
  EXPECT_THROW(check_run_dir(d + "/" + std::string(300, 'x'), false, false), ConfigError);
}

}  // namespace
}  // namespace loom
