// Issue 59 through the `loom` binary: loom owns only what it wrote, known by content
// (Note [Ownership by content], Note [Checkpoint directory ownership]). Each finding of the
// issue that is about ownership has its regression test here, and a property test passes
// random trees of look-alike entries through every command that writes.
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/abandoned.h"
#include "support/loom_cli.h"

namespace {

namespace fs = std::filesystem;

using namespace loom::testing_support::cli_case;  // Result, run, kTiny, train

std::string fresh(const std::string& name) { return loom::testing_support::fresh_dir("own_" + name); }

std::string read(const std::string& path) { return loom::testing_support::read_bytes(path); }

// Every entry under `dir` with what it is: a file's bytes, a symlink's target, a FIFO as
// such. Nothing is followed or opened but regular files.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path& p = it->path();
    const std::string rel = fs::relative(p, dir).string();
    const fs::file_status st = fs::symlink_status(p);
    if (fs::is_symlink(st)) out[rel] = "symlink:" + fs::read_symlink(p).string();
    else if (fs::is_regular_file(st)) out[rel] = "file:" + read(p.string());
    else if (fs::is_directory(st)) out[rel] = "dir";
    else out[rel] = "other";
  }
  return out;
}

void expect_refused(const Result& r, const std::string& names, const std::string& what) {
  EXPECT_EQ(r.code, 2) << what << "\n" << r.output;
  EXPECT_NE(r.output.find(names), std::string::npos) << what << "\n" << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << what << ": refused only after training\n" << r.output;
}

// A finished run's checkpoint and its export, shared by the tests that need one.
struct Work {
  std::string ck, st;
};
const Work& work() {
  static const Work w = [] {
    const std::string d = fresh("work" + std::to_string(::getpid()));  // ctest runs the cases in parallel
    Work out{d + "/ck", d + "/model.st"};
    EXPECT_EQ(run(train(out.ck, 2)).code, 0);
    EXPECT_EQ(run("export --checkpoint " + out.ck + " --format safetensors --out " + out.st).code, 0);
    return out;
  }();
  return w;
}

// Findings 1, 6 and 8: user entries whose names look like loom's are refused, never removed.
TEST(Ownership, LookalikeEntriesInATargetAreRefusedAndKept) {
  const std::string d = fresh("lookalike");
  for (const char* n : {"config.toml.tmpl", "state.json.tmp-notes", "model.safetensors.tmpbackup"}) {
    const std::string ck = d + "/" + n + "_dir";
    fs::create_directories(ck);
    std::ofstream(ck + "/" + n) << "mine";
    const auto before = snapshot(d);
    expect_refused(run(train(ck, 2)), std::string("'") + n + "'", std::string("train beside ") + n);
    Result r = run("import --format safetensors --in " + work().st + " --checkpoint " + ck);
    EXPECT_EQ(r.code, 2) << r.output;
    r = run("ckpt convert --in " + work().ck + " --out " + ck + " --dp 2");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_EQ(snapshot(d), before) << n;
  }
  const std::string ck = d + "/tmpdir";
  fs::create_directories(ck + "/step-00000010.tmp");
  std::ofstream(ck + "/step-00000010.tmp/mine") << "x";
  std::ofstream(ck + "/latest") << "my own notes\n";
  const auto before = snapshot(d);
  const Result r = run(train(ck, 2));
  expect_refused(r, "'step-00000010.tmp'", "a user's step-N.tmp/");
  EXPECT_NE(r.output.find("'latest'"), std::string::npos) << r.output;
  EXPECT_EQ(snapshot(d), before);
}

// Finding 2: import and convert take the lock of the directory they write; a live job's
// (here this test process holds it, as a running job's rank 0 does) refuses them.
TEST(Ownership, ImportAndConvertRespectALiveJobsLock) {
  const std::string d = fresh("lock");
  const std::string ck = d + "/ck";
  fs::create_directories(ck);
  const int fd = ::open((ck + "/loom.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  const std::string line = "loom-lock-1 pid " + std::to_string(::getpid()) + " on test\n";
  ASSERT_EQ(::write(fd, line.data(), line.size()), ssize_t(line.size()));
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const auto before = snapshot(d);
  for (const std::string& cmd : {"import --format safetensors --in " + work().st + " --checkpoint " + ck,
                                 "ckpt convert --in " + work().ck + " --out " + ck + " --dp 2", train(ck, 2)}) {
    const Result r = run(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find("in use by another loom job (pid " + std::to_string(::getpid())), std::string::npos)
        << cmd << "\n" << r.output;
  }
  EXPECT_EQ(snapshot(d), before);
  ::close(fd);  // the "job" ends: import may write there now
  ASSERT_EQ(run("import --format safetensors --in " + work().st + " --checkpoint " + ck).code, 0);
  EXPECT_EQ(run(train(ck, 3, "--resume auto")).code, 0);
}

// Finding 3 and 8: a loom.lock that is a symlink, a FIFO or a user's file is refused and
// neither followed, opened for writing nor truncated.
TEST(Ownership, ALockThatIsNotLoomsIsNeverFollowedOrTruncated) {
  const std::string d = fresh("symlock");
  std::ofstream(d + "/outside.txt") << "precious";
  for (const std::string kind : {"symlink", "fifo", "file"}) {
    const std::string ck = d + "/" + kind;
    fs::create_directories(ck);
    if (kind == "symlink") fs::create_symlink(d + "/outside.txt", ck + "/loom.lock");
    if (kind == "fifo") {
      ASSERT_EQ(::mkfifo((ck + "/loom.lock").c_str(), 0644), 0);
    }
    if (kind == "file") std::ofstream(ck + "/loom.lock") << "my lock-picking notes";
    const auto before = snapshot(d);
    expect_refused(run(train(ck, 2)), "loom.lock", "train, loom.lock a " + kind);
    Result r = run("ckpt convert --in " + work().ck + " --out " + ck + " --dp 2");
    EXPECT_EQ(r.code, 2) << kind << "\n" << r.output;
    r = run("import --format safetensors --in " + work().st + " --checkpoint " + ck);
    EXPECT_EQ(r.code, 2) << kind << "\n" << r.output;
    EXPECT_EQ(snapshot(d), before) << kind;
  }
  EXPECT_EQ(read(d + "/outside.txt"), "precious");
}

// Finding 13: pruning removes only the files a step's manifest names; a user's file put
// into an old step stays (with its directory), and a step whose manifest is not loom's is
// the user's from the start.
TEST(Ownership, PruningRemovesOnlyWhatTheManifestNames) {
  const std::string d = fresh("prune");
  const std::string ck = d + "/ck";
  ASSERT_EQ(run(train(ck, 2, "--save-every 1")).code, 0);
  std::ofstream(ck + "/step-00000001/my-notes.txt") << "notes";
  const Result r = run(train(ck, 3, "--resume auto --save-every 1 --set checkpoint.keep_last=1"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("left " + ck + "/step-00000001: it holds entries loom did not write"), std::string::npos)
      << r.output;
  EXPECT_EQ(read(ck + "/step-00000001/my-notes.txt"), "notes");
  EXPECT_FALSE(fs::exists(ck + "/step-00000001/manifest.json"));
  EXPECT_FALSE(fs::exists(ck + "/step-00000002"));
  EXPECT_TRUE(fs::exists(ck + "/step-00000003/manifest.json"));

  const std::string user = d + "/user";
  fs::create_directories(user + "/step-00000001");
  std::ofstream(user + "/step-00000001/manifest.json") << "{\"my\": \"manifest\"}";
  const auto before = snapshot(d);
  expect_refused(run(train(user, 2, "--resume auto --set checkpoint.keep_last=1")), "'step-00000001'",
                 "a user's step-N with its own manifest.json");
  EXPECT_EQ(snapshot(d), before);
}

// Finding 15: data prepare --overwrite replaces only shards and summaries it can prove its
// own; a user's directory or file with a shard's name is refused.
TEST(Ownership, DataPrepareOverwriteKeepsTheUsersLookalikes) {
  const std::string d = fresh("prepare");
  std::ofstream(d + "/in.txt") << "one\n%\ntwo\n%\nthree\n%\nfour\n";
  const std::string prep = "data prepare --tokenizer byte --in " + d + "/in.txt --doc-separator % --val-fraction 0.5";
  ASSERT_EQ(run(prep + " --out " + d + "/out").code, 0);
  fs::create_directories(d + "/out/train_mydata.bin");
  std::ofstream(d + "/out/val_notes.bin") << "my notes";
  const auto before = snapshot(d);
  const Result r = run(prep + " --out " + d + "/out --overwrite");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("did not write (train_mydata.bin and 1 more)"), std::string::npos) << r.output;
  EXPECT_EQ(snapshot(d), before);
  fs::remove_all(d + "/out/train_mydata.bin"), fs::remove(d + "/out/val_notes.bin");
  EXPECT_EQ(run(prep + " --out " + d + "/out --overwrite").code, 0);  // its own shards are replaced
}

// Finding 19: a killed prepare or import leaves a marked temporary directory; the next
// command on that target removes it, and only it.
TEST(Ownership, TheNextCommandRemovesWhatAKilledOneLeft) {
  const std::string d = fresh("killed");
  std::ofstream(d + "/in.txt") << "one\n%\ntwo\n%\nthree\n";
  const std::string dead = loom::testing_support::abandoned_temp(d, "out");
  fs::create_directories(d + "/out.tmp-123");                       // the user's, or an old loom's: kept
  fs::create_directories(d + "/out.loom-tmp-0123456789abcdef");     // no marker: kept
  Result r = run("data prepare --tokenizer byte --in " + d + "/in.txt --doc-separator % --val-fraction 0 --out " +
                 d + "/out");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("removed " + fs::path(dead).filename().string() + ", left by a prepare that was killed"),
            std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(d + "/out.tmp-123"));
  EXPECT_TRUE(fs::exists(d + "/out.loom-tmp-0123456789abcdef"));

  const std::string dead_export = loom::testing_support::abandoned_temp(d, "m.st");
  ASSERT_EQ(run("export --checkpoint " + work().ck + " --format safetensors --out " + d + "/m.st").code, 0);
  EXPECT_FALSE(fs::exists(dead_export));

  fs::create_directories(d + "/imp");
  const std::string dead_import = loom::testing_support::abandoned_temp(d + "/imp", "whole-checkpoint");
  ASSERT_EQ(run("import --format safetensors --in " + work().st + " --checkpoint " + d + "/imp").code, 0);
  EXPECT_FALSE(fs::exists(dead_import));
  for (const auto& e : fs::directory_iterator(d + "/imp"))
    EXPECT_EQ(e.path().filename().string().find(".loom-tmp-"), std::string::npos) << e.path();
}

// Finding 14: every file loom writes at a path the user names refuses an existing file
// that is not an earlier output of loom's of that kind, unless --overwrite; a symlink there
// is never written through, --overwrite or not (Note [User-named outputs]).
TEST(Ownership, OutputsReplaceOnlyLoomsOwnFilesWithoutOverwrite) {
  const std::string d = fresh("outputs");
  std::ofstream(d + "/outside.txt") << "precious";
  const std::string sim = "simulate --model gpt-1.7b --gpus 8 --tp 8 --global-batch 8";
  const std::string plan = "plan --model gpt-1.7b --gpus 8 --global-batch 8 --top 1 --emit loom";
  const std::vector<std::pair<std::string, std::string>> writers = {
      {"export --checkpoint " + work().ck + " --format safetensors --out ", ""},
      {sim + " --trace ", ""},
      {sim + " --svg ", ""},
      {plan + " --out ", ""},
      {"data batches" + kTiny + " --set train.steps=2 --out ", ""},
      {train(d + "/ck", 1, "--trace "), ""}};
  for (size_t i = 0; i < writers.size(); ++i) {
    const std::string out = d + "/out" + std::to_string(i);
    std::ofstream(out) << "mine";
    const std::string cmd = writers[i].first + out;
    Result r = run(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find("exists and is not an earlier output of loom's"), std::string::npos) << cmd << "\n" << r.output;
    EXPECT_EQ(read(out), "mine") << cmd;
    fs::remove(out);
    fs::create_symlink(d + "/outside.txt", out);
    const std::string again = i == 5 ? train(d + "/ck" + std::to_string(i), 1, "--overwrite --trace ") + out
                                     : cmd + " --overwrite";
    r = run(again);
    EXPECT_EQ(r.code, 2) << again << "\n" << r.output;
    EXPECT_NE(r.output.find("is a symlink"), std::string::npos) << again << "\n" << r.output;
    EXPECT_EQ(read(d + "/outside.txt"), "precious") << again;
    fs::remove(out);
    // A new path, then the same command again: loom's own output is replaced without asking
    // (except the batches file, which carries no mark and needs --overwrite).
    const std::string fresh_cmd = i == 5 ? train(d + "/cka" + std::to_string(i), 1, "--trace ") + out : cmd;
    ASSERT_EQ(run(fresh_cmd).code, 0) << fresh_cmd;
    const std::string second = i == 5 ? train(d + "/ckb" + std::to_string(i), 1, "--trace ") + out
                                      : i == 4 ? cmd + " --overwrite" : cmd;
    r = run(second);
    EXPECT_EQ(r.code, 0) << second << "\n" << r.output;
  }
}

// Finding 12: data batches refuses --steps 0 or below, a size past the free space before
// writing anything, and a killed run's temporary is removed by the next run on --out.
TEST(Ownership, DataBatchesIsBoundedAndLeavesNoPartialFile) {
  const std::string d = fresh("batches");
  const std::string cmd = "data batches" + kTiny + " --set train.steps=2 --out " + d + "/b.bin";
  for (const char* steps : {" --steps 0", " --steps -1"}) {
    const Result r = run(cmd + steps);
    EXPECT_EQ(r.code, 2) << steps << "\n" << r.output;
  }
  Result r = run(cmd + " --steps 100000000000");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("GB free: lower --steps"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_empty(d));
  const std::string dead = loom::testing_support::abandoned_temp(d, "b.bin");
  r = run(cmd);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("removed " + fs::path(dead).filename().string()), std::string::npos) << r.output;
  EXPECT_EQ(fs::file_size(d + "/b.bin"), 8u + 2u * 2u * 12u * 32u * 4u);
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1);
}

// The property: random trees of look-alikes of every artifact loom writes (files with
// random bytes, directories, symlinks out of the tree, FIFOs), beside the targets and
// inside a target of the user's, pass through train / resume / prune / export / import /
// convert / prepare. Every entry of the user's stays as it was; the only new entries are the
// named targets.
TEST(Ownership, RandomLookalikeTreesSurviveEveryCommand) {
  const char* kNames[] = {"latest", "latest.tmp", "loom.lock", "step-00000001", "step-00000002.tmp",
                          "step-00000003.loom-tmp-00000000000000aa", "replaced-20260101T000000Z", "replaced-x",
                          "config.toml", "config.toml.tmp", "model.safetensors", "model.safetensors.tmp",
                          "optim.safetensors", "state.json", "state.json.tmp", "manifest.json", "train_00000.bin",
                          "val_00000.bin", "prepare.json", "whole-checkpoint.loom-tmp-00000000000000bb",
                          "ck.tmp-42", "ck.loom-tmp-00000000000000cc", "prep.tmp-7", "prep.loom-tmp-00000000000000dd",
                          "st.safetensors.tmp", "st.safetensors.loom-tmp-00000000000000ee", "ck.old-9"};
  std::mt19937 rng(59);
  for (int trial = 0; trial < 3; ++trial) {
    const std::string root = fresh("property" + std::to_string(trial)), s = root + "/scratch";
    fs::create_directories(s + "/userck");
    std::ofstream(root + "/outside.txt") << "outside";
    std::ofstream(root + "/in.txt") << "alpha\n%\nbeta\n%\ngamma\n";
    for (const std::string& where : {s, s + "/userck"})
      for (const char* n : kNames) {
        const std::string p = where + "/" + n;
        switch (rng() % 5) {
          case 0: break;  // absent this time
          case 1: std::ofstream(p) << "user bytes " << rng(); break;
          case 2: fs::create_directories(p), std::ofstream(p + "/manifest.json") << "{\"user\": " << rng() << "}"; break;
          case 3: fs::create_symlink(root + "/outside.txt", p); break;
          case 4: ::mkfifo(p.c_str(), 0644); break;
        }
      }
    if (trial == 2) {  // only entries an earlier loom took for its own by their names
      fs::remove_all(s + "/userck");
      fs::create_directories(s + "/userck/step-00000002.tmp");
      std::ofstream(s + "/userck/step-00000002.tmp/rank-00000.bin") << "user";
      std::ofstream(s + "/userck/latest.tmp") << "step-00000001\n";
      std::ofstream(s + "/userck/config.toml.tmp") << "user";
      fs::create_directories(s + "/userck/step-00000001");
      std::ofstream(s + "/userck/step-00000001/manifest.json") << "{}";
    }
    if (fs::is_empty(s + "/userck")) std::ofstream(s + "/userck/latest") << "user";
    const auto before = snapshot(root);
    const std::string ck = s + "/ck", st = s + "/st.safetensors";
    const std::vector<std::string> ok = {
        train(ck, 2, "--save-every 1"), train(ck, 3, "--resume auto --save-every 1 --set checkpoint.keep_last=1"),
        "export --checkpoint " + ck + " --format safetensors --out " + st,
        "import --format safetensors --in " + st + " --checkpoint " + s + "/imp",
        "ckpt convert --in " + ck + " --out " + s + "/conv --dp 2",
        "data prepare --tokenizer byte --in " + root + "/in.txt --doc-separator % --val-fraction 0 --out " + s + "/prep"};
    for (const std::string& cmd : ok) {
      const Result r = run(cmd);
      EXPECT_EQ(r.code, 0) << "trial " << trial << ": " << cmd << "\n" << r.output;
    }
    const std::string u = s + "/userck";
    for (const std::string& cmd : {train(u, 2), train(u, 2, "--resume auto"), train(u, 2, "--overwrite"),
                                   "import --format safetensors --in " + st + " --checkpoint " + u,
                                   "ckpt convert --in " + ck + " --out " + u + " --dp 2",
                                   "data prepare --tokenizer byte --in " + root + "/in.txt --out " + u + " --overwrite"}) {
      const Result r = run(cmd);
      EXPECT_NE(r.code, 0) << "trial " << trial << ": " << cmd << "\n" << r.output;
    }
    auto after = snapshot(root);
    for (const char* target : {"scratch/ck", "scratch/st.safetensors", "scratch/imp", "scratch/conv", "scratch/prep"}) {
      EXPECT_TRUE(after.count(target)) << target;
      for (auto it = after.begin(); it != after.end();)
        it = it->first == target || it->first.rfind(std::string(target) + "/", 0) == 0 ? after.erase(it) : std::next(it);
    }
    EXPECT_EQ(after, before) << "trial " << trial;
  }
}

}  // namespace
