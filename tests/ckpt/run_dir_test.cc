// Note [Checkpoint directory ownership]: what survey_dir calls loom's and what it calls the
// user's, the lock, and moving a run aside.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/run_dir.h"
#include "loom/core/fileio.h"
#include "support/abandoned.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "/run_dir_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A step directory whose manifest carries the sharded format tag (what the survey reads).
void tagged_step(const std::string& dir) {
  fs::create_directories(dir);
  std::ofstream(dir + "/manifest.json") << "{\"format\": \"loom-sharded-v2\"}";
}

TEST(RunDir, SurveyTellsLoomsEntriesFromTheUsers) {
  const std::string d = fresh("survey");
  tagged_step(d + "/step-00000010");
  fs::create_directories(d + "/step-00000020");       // no manifest: not a step loom finished
  const std::string stale = testing_support::abandoned_temp(d, "step-00000030");  // a save killed midway
  tagged_step(d + "/replaced-20261123T000000Z/step-00000005");  // what --overwrite moved aside
  std::ofstream(d + "/latest") << "step-00000010\n";
  std::ofstream(d + "/loom.lock") << "pid 1 on x\n";  // an earlier loom's lock line
  std::ofstream(d + "/config.toml") << "[model]\n";  // a user's config.toml: no loom model.safetensors beside it
  std::ofstream(d + "/notes.txt") << "mine";
  const DirSurvey s = survey_dir(d);
  EXPECT_TRUE(s.exists);
  EXPECT_EQ(s.steps, std::vector<int64_t>{10});
  EXPECT_EQ(s.stale, std::vector<std::string>{fs::path(stale).filename().string()});
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
  EXPECT_EQ(remove_stale(s), s.stale);
  EXPECT_FALSE(fs::exists(stale));
}

// The supervisor's SIGKILL between a save's mkdir and its marker (seen in
// mpi_supervisor_supervisor-signals): the directory with its marker beside it is a stale
// entry, not the user's, and --resume auto clears it.
TEST(RunDir, ASaveKilledAsItsDirectoryIsMadeIsStale) {
  const std::string d = fresh("killed_mkdir");
  tagged_step(d + "/step-00000005");
  const std::string tmp = "step-00000010.loom-tmp-0123456789abcdef";
  fs::create_directories(d + "/" + tmp);
  std::ofstream(d + "/" + tmp + ".loom-owner") << "loom-owned-1 0123456789abcdef pid 1 host x\n";
  const DirSurvey s = survey_dir(d);
  EXPECT_TRUE(s.foreign.empty());
  EXPECT_EQ(s.stale, (std::vector<std::string>{tmp, tmp + ".loom-owner"}));
  EXPECT_EQ(remove_stale(s), std::vector<std::string>{tmp});  // its marker with it
  EXPECT_FALSE(fs::exists(d + "/" + tmp));
  EXPECT_FALSE(fs::exists(d + "/" + tmp + ".loom-owner"));
  EXPECT_EQ(survey_dir(d).steps, std::vector<int64_t>{5});
}

// Issue 59: names alone decide nothing. Each entry below looks like one of loom's by its
// name, and its content (or its kind) says it is the user's.
TEST(RunDir, LookalikeNamesAreTheUsers) {
  const std::string d = fresh("lookalike");
  std::ofstream(d + "/outside") << "precious";
  fs::create_directories(d + "/ck");
  const std::string ck = d + "/ck";
  for (const char* n : {"config.toml.tmpl", "state.json.tmp-notes", "model.safetensors.tmpbackup", "latest.tmp"})
    std::ofstream(ck + "/" + n) << "mine";
  fs::create_directories(ck + "/step-00000010.tmp");                 // the old unfinished-save name
  fs::create_directories(ck + "/step-00000011.loom-tmp-0123456789abcdef");  // no marker
  fs::create_directories(ck + "/step-00000001");
  std::ofstream(ck + "/step-00000001/manifest.json") << "{\"mine\": true}";  // not loom's manifest
  fs::create_directories(ck + "/replaced-mine");
  fs::create_directories(ck + "/replaced-20260101T000000Z/photos");  // a stamp's name, the user's content
  const DirSurvey s = survey_dir(ck);
  EXPECT_TRUE(s.steps.empty());
  EXPECT_TRUE(s.stale.empty());
  EXPECT_TRUE(s.replaced.empty());
  EXPECT_EQ(s.foreign.size(), 9u);
  try {
    refuse_foreign(s, "checkpoint.dir");
    FAIL() << "lookalikes accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unfinished save of an earlier loom version"), std::string::npos) << e.what();
  }
  // `latest` and `loom.lock` are loom's only with loom's content; a symlink never is.
  const std::string l = fresh("lookalike_files");
  std::ofstream(l + "/latest") << "my notes\n";
  std::ofstream(l + "/loom.lock") << "my lock notes\n";
  EXPECT_EQ(survey_dir(l).foreign, (std::vector<std::string>{"latest", "loom.lock"}));
  EXPECT_FALSE(survey_dir(l).latest);
  try {
    const DirLock lock(l);
    FAIL() << "a user's loom.lock was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a lock loom wrote"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file_bytes(l + "/loom.lock"), "my lock notes\n");
  fs::remove(l + "/loom.lock");
  fs::create_symlink(d + "/outside", l + "/loom.lock");
  EXPECT_THROW(DirLock{l}, ConfigError);
  EXPECT_EQ(read_file_bytes(d + "/outside"), "precious");
  fs::remove(l + "/loom.lock");
  ASSERT_EQ(::mkfifo((l + "/loom.lock").c_str(), 0644), 0);
  EXPECT_THROW(DirLock{l}, ConfigError);  // refused at once, never blocks
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
  tagged_step(d + "/step-00000004");
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
