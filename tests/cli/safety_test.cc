// Issues 22 and 23 through the `loom` binary, as a user meets them: nothing a user points
// loom at is deleted or mixed with another run (Note [Checkpoint directory ownership]),
// --resume auto continues from what is there (Note [Resume auto]), and bad outputs are
// refused (exit 2) before the first training step.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "support/abandoned.h"
#include "support/loom_cli.h"

namespace {

namespace fs = std::filesystem;

using namespace loom::testing_support::cli_case;  // Result, run, kTiny, train

// Every entry under `dir`, recursively, with each file's contents (so "unchanged" is exact).
std::set<std::string> snapshot(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::string item = fs::relative(e.path(), dir).string();
    if (e.is_regular_file()) {
      std::ifstream f(e.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      item.append(1, '=').append(bytes);
    }
    out.insert(item);
  }
  return out;
}

std::set<std::string> steps_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("step-", 0) == 0) out.insert(e.path().filename().string());
  return out;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "/safety_" + name;
  fs::remove_all(d);
  return d;
}

void expect_refused_before_training(const Result& r, const std::string& names, const std::string& what) {
  EXPECT_EQ(r.code, 2) << what << "\n" << r.output;
  EXPECT_NE(r.output.find(names), std::string::npos) << what << "\n" << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << what << ": refused only after training\n" << r.output;
}

// Issue 23 item 1: train, import, ckpt convert and export pointed at a directory of the
// user's own files refuse, naming them, and leave every byte as it was.
TEST(Safety, UserFilesSurviveEveryCommandPointedAtThem) {
  const std::string victim = fresh("victim"), work = fresh("work");
  fs::create_directories(victim + "/sub");
  std::ofstream(victim + "/thesis.txt") << "precious";
  std::ofstream(victim + "/sub/notes") << "also precious";
  const std::set<std::string> before = snapshot(victim);
  expect_refused_before_training(run(train(victim, 2)), "'thesis.txt'", "train");
  expect_refused_before_training(run(train(victim, 2, "--save-every 1")), "'thesis.txt'", "train --save-every");
  expect_refused_before_training(run(train(victim, 2, "--overwrite")), "'thesis.txt'", "train --overwrite");
  ASSERT_EQ(run(train(work, 2)).code, 0);
  ASSERT_EQ(run("export --checkpoint " + work + " --format safetensors --out " + work + ".st").code, 0);
  Result r = run("import --format safetensors --in " + work + ".st --checkpoint " + victim);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("'thesis.txt'"), std::string::npos) << r.output;
  r = run("ckpt convert --in " + work + " --out " + victim + " --dp 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("'thesis.txt'"), std::string::npos) << r.output;
  r = run("export --checkpoint " + work + " --format safetensors --out " + victim);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(snapshot(victim), before);
  // The current directory, and a regular file at the path.
  expect_refused_before_training(loom::testing_support::run_loom(train(".", 2), victim), "'thesis.txt'",
                                 "checkpoint.dir=.");
  expect_refused_before_training(run(train(victim + "/thesis.txt", 2)), "is a file, not a directory", "a file");
  EXPECT_EQ(snapshot(victim), before);
}

// Issue 22 items 1 and 2: a resumed run without --save-every adds its end as one more step
// (the earlier steps and `latest` stay); a fresh run refuses a directory holding another
// run, and --overwrite moves that run aside without deleting it.
TEST(Safety, RunsNeverDestroyOrMixEachOthersCheckpoints) {
  const std::string ck = fresh("ck");
  ASSERT_EQ(run(train(ck, 30, "--save-every 10")).code, 0);
  Result r = run(train(ck, 40, "--resume auto"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(steps_in(ck), (std::set<std::string>{"step-00000020", "step-00000030", "step-00000040"}));
  EXPECT_EQ(read(ck + "/latest"), "step-00000040\n");
  EXPECT_FALSE(fs::exists(ck + "/model.safetensors"));
  const std::set<std::string> before = snapshot(ck);
  r = run(train(ck, 5));
  expect_refused_before_training(r, "holds checkpoints of an earlier run, newest step 40", "fresh run");
  for (const char* offer : {"--resume auto", "--overwrite", "new directory"})
    EXPECT_NE(r.output.find(offer), std::string::npos) << offer << "\n" << r.output;
  EXPECT_EQ(snapshot(ck), before);
  r = run(train(ck, 5, "--overwrite"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--overwrite: moved the earlier run's checkpoints"), std::string::npos) << r.output;
  EXPECT_EQ(read(ck + "/latest"), "step-00000005\n");
  std::string aside;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.path().filename().string().rfind("replaced-", 0) == 0) aside = e.path().string();
  ASSERT_FALSE(aside.empty());
  EXPECT_EQ(steps_in(aside), (std::set<std::string>{"step-00000020", "step-00000030", "step-00000040"}));
  EXPECT_EQ(run("ckpt inspect --verify " + aside).code, 0);  // the old run is whole, where it was moved
}

// Issue 22 item 3 and issue 23 item 2: --resume auto continues from the newest step that
// loads (naming what it skipped and why), from the steps when `latest` is missing, and from
// a whole-model checkpoint; --resume DIR stays strict.
TEST(Safety, ResumeAutoContinuesFromWhatIsThere) {
  const std::string ck = fresh("fallback");
  ASSERT_EQ(run(train(ck, 20, "--save-every 10")).code, 0);
  const std::string bin = ck + "/step-00000020/rank-00000.bin";
  fs::resize_file(bin, fs::file_size(bin) / 2);  // the newest step is truncated
  Result r = run(train(ck, 20, "--resume auto"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("skipping step-00000020: checkpoint: '"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ck + "/step-00000010 at step 10"), std::string::npos) << r.output;
  // The new step 20 took the damaged one's place, which was moved aside, not deleted.
  EXPECT_EQ(run("ckpt inspect --verify " + ck).code, 0);
  std::string damaged;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.path().filename().string().rfind("replaced-", 0) == 0) damaged = e.path().string() + "/step-00000020";
  ASSERT_TRUE(fs::exists(damaged + "/manifest.json"));
  r = run(train(fresh("strict"), 20, "--resume " + damaged));  // --resume DIR is strict
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;

  // Resuming another model's checkpoint into this run's directory would mix two runs.
  const std::string other = fresh("other_model");
  ASSERT_EQ(run(train(other, 2, "--set model.layers=1")).code, 0);
  expect_refused_before_training(run(train(ck, 4, "--set model.layers=1 --resume " + other + "/step-00000002")),
                                 "holds checkpoints of another model", "resume into another model's directory");

  fs::remove(ck + "/latest");  // `latest` lost: the steps are still there
  r = run(train(ck, 25, "--resume auto"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ck + "/step-00000020 at step 20"), std::string::npos) << r.output;

  // A whole-model checkpoint (here: `loom import` of an export) is a place to continue from.
  const std::string imp = fresh("imported");
  ASSERT_EQ(run("export --checkpoint " + ck + " --format safetensors --out " + imp + ".st").code, 0);
  ASSERT_EQ(run("import --format safetensors --in " + imp + ".st --checkpoint " + imp).code, 0);
  r = run(train(imp, 3, "--resume auto"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + imp + " at step 0 (whole-model checkpoint)"), std::string::npos) << r.output;
  EXPECT_EQ(steps_in(imp), (std::set<std::string>{"step-00000003"}));
}

// Issue 22 item 5: an unfinished save is removed at the next run that holds the
// directory's lock; a second job cannot hold it while the first runs. Issue 59: only a save
// loom can prove its own (Note [Ownership by content]) — a user's `step-N.tmp/` is refused.
TEST(Safety, UnfinishedSavesAreRemovedUnderTheLock) {
  const std::string ck = fresh("stale");
  // Rank 0 killed once step 6's manifest is written, before the directory is renamed.
  Result r = loom::testing_support::run_loom(train(ck, 8, "--save-every 2"), "", "LOOM_FAILPOINT=manifest@6:0");
  ASSERT_NE(r.code, 0) << r.output;
  std::string left;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.path().filename().string().rfind("step-00000006.loom-tmp-", 0) == 0) left = e.path().string();
  ASSERT_FALSE(left.empty()) << r.output;
  r = run(train(ck, 6, "--resume auto"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("removed an unfinished save: " + left), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(left));
  EXPECT_EQ(read(ck + "/latest"), "step-00000006\n");
  // A directory of the user's with the old name of an unfinished save stays, and is named.
  fs::create_directories(ck + "/step-00000008.tmp");
  std::ofstream(ck + "/step-00000008.tmp/rank-00000.bin") << "my half of a shard";
  const std::set<std::string> before = snapshot(ck);
  expect_refused_before_training(run(train(ck, 8, "--resume auto")), "'step-00000008.tmp'", "a user's step-N.tmp");
  EXPECT_EQ(snapshot(ck), before);
}

// Issue 23 item 4: output paths that cannot be written are refused before the first step.
TEST(Safety, UnwritableOutputsAreRefusedUpFront) {
  const std::string ck = fresh("outputs");
  expect_refused_before_training(run(train(ck, 2, "--trace /nonexistent/t.json")), "/nonexistent", "--trace");
  expect_refused_before_training(run(train("/proc/loom-ck", 2)), "/proc/loom-ck", "read-only checkpoint.dir");
  expect_refused_before_training(run(train("/etc/hostname/ck", 2)), "/etc/hostname", "a file on the path");
  expect_refused_before_training(run(train(ck + "/" + std::string(300, 'x'), 2)), "characters", "over-long name");
  std::string deep = ck;
  while (deep.size() < 4100) deep += "/abcdefghijklmnopqrstuvwxyz";
  expect_refused_before_training(run(train(deep, 2)), "characters long", "over-long path");
}

// Issue 22 items 1, 2, 3 and 5 again with two real MPI ranks (loom train --nproc 2 --dp 2):
// every rank writes its shard of each step, rank 0 holds the lock and publishes.
TEST(Safety, TheSameHoldsForADp2JobUnderMpirun) {
  const std::string ck = fresh("dp2");
  const std::string dp2 = " --nproc 2 --dp 2 --set comm.timeout_s=30";
  Result r = run(train(ck, 20, "--save-every 10" + dp2));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(train(ck, 30, "--resume auto" + dp2));  // no --save-every: its end is one more step
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(steps_in(ck), (std::set<std::string>{"step-00000010", "step-00000020", "step-00000030"}));
  const std::set<std::string> before = snapshot(ck);
  expect_refused_before_training(run(train(ck, 5, dp2)), "newest step 30", "a fresh dp2 run");
  EXPECT_EQ(snapshot(ck), before);
  const std::string bin = ck + "/step-00000030/rank-00001.bin";  // rank 1's shard of the newest step
  fs::resize_file(bin, fs::file_size(bin) / 2);
  const std::string stale = loom::testing_support::abandoned_temp(ck, "step-00000040");
  r = run(train(ck, 30, "--resume auto" + dp2));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("skipping step-00000030: rank 1: checkpoint: '"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ck + "/step-00000020 at step 20"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("removed an unfinished save: " + stale), std::string::npos) << r.output;
  EXPECT_EQ(run("ckpt inspect --verify " + ck).code, 0);
}

// Issue 23 items 5 and 7: sizes that cannot fit and negative or zero flags are refused
// as usage errors naming the value, before anything runs.
TEST(Safety, ImpossibleSizesAndNegativeFlagsAreRefused) {
  const std::string none = " --set checkpoint.dir=";
  for (const char* b : {"9223372036854775807", "4611686018427387904"})
    expect_refused_before_training(run(train("", 2, std::string("--set train.batch=") + b) + none), b, "huge batch");
  expect_refused_before_training(run(train("", 2, "--set train.batch=1000000")), "activations at micro-batch 1000000",
                                 "batch beyond memory");
  expect_refused_before_training(run("train --set model.preset=gpt2-medium --set train.batch=1024 --set checkpoint.dir="),
                                 "lower the micro-batch", "gpt2-medium at batch 1024");
  for (const char* flag : {"--dp -2", "--tp -1", "--pp -1", "--vpp -1", "--zero -1", "--grad-accum -1",
                           "--micro-batch -1", "--nproc -1", "--nproc 0", "--save-every -3"}) {
    const Result r = run(train("", 2, flag));
    EXPECT_EQ(r.code, 2) << flag << "\n" << r.output;
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    EXPECT_NE(r.output.find(name + ": expected"), std::string::npos) << flag << "\n" << r.output;
  }
  for (const char* args : {"simulate --gpus 0", "simulate --gpus -8", "simulate --global-batch 0",
                           "simulate --global-batch -5", "plan --gpus 8 --global-batch 0", "sample --tokens -1 "
                           "--checkpoint /x"}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("expected"), std::string::npos) << args << "\n" << r.output;
  }
  Result r = run("verify --configs \"dp=2;tp=3\"" + kTiny);  // tp 3 does not divide 4 heads
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("layout 'parallel.tp=3'"), std::string::npos) << r.output;
}

// Issue 23 item 6: a run that diverges stops with an error and saves nothing over the good
// checkpoints before it.
TEST(Safety, ADivergedRunSavesNothing) {
  const std::string ck = fresh("diverged");
  ASSERT_EQ(run(train(ck, 4, "--save-every 2")).code, 0);
  const std::set<std::string> before = snapshot(ck);
  const Result r = run(train(ck, 8, "--save-every 1 --resume auto --set optim.lr=1e300 --set optim.warmup_steps=0"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("training diverged"), std::string::npos) << r.output;
  EXPECT_EQ(read(ck + "/latest"), "step-00000004\n");
  for (const auto& e : fs::directory_iterator(ck)) EXPECT_NE(e.path().filename(), "step-00000005") << r.output;
  EXPECT_EQ(run("ckpt inspect --verify " + ck).code, 0);
}

// Issue 23 items 8 and 9: verify checks that the pieces cover every tensor, not only their
// CRCs; a garbage `latest` is shown escaped, never echoed raw.
TEST(Safety, VerifyChecksCoverageAndGarbageIsShownEscaped) {
  const std::string ck = fresh("coverage");
  ASSERT_EQ(run(train(ck, 2, "--save-every 2")).code, 0);
  const std::string manifest = ck + "/step-00000002/manifest.json";
  std::string text = read(manifest);
  // Drop the first piece of rank 0's table: [tensor, section, offset, count, byte, crc].
  const size_t pieces = text.find("\"pieces\"");
  const size_t open = text.find("[", text.find("[", pieces) + 1), close = text.find("]", open);
  ASSERT_NE(close, std::string::npos);
  text.erase(open, close + 1 - open + (text[close + 1] == ',' ? 1 : 0));
  std::ofstream(manifest) << text;
  Result r = run("ckpt inspect --verify " + ck);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("no piece holds tensor"), std::string::npos) << r.output;
  std::ofstream(ck + "/latest") << "\x1b[31mstep-evil\x07";
  r = run("ckpt inspect " + ck);
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\\x1b[31mstep-evil\\x07"), std::string::npos) << r.output;
}

}  // namespace
