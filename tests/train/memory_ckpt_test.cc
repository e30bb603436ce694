// Note [In-memory checkpoints]: every rank's shard in its host's store and a peer host's; a
// lost host's shards come from the peers' copies, with no disk read, and the resumed job equals
// one resumed by hand from a disk checkpoint of the same step on the same layout.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "loom/ckpt/memory_ckpt.h"
#include "loom/ckpt/run_dir.h"
#include "loom/ckpt/shard_format.h"
#include "loom/comm/world.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/hosts.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Sets = std::vector<std::string>;

Config small(const Sets& more) {
  Sets sets = {"model.layers=2",    "model.d_model=64",    "model.heads=4",        "model.ffn=128",
               "model.ctx=32",      "train.batch=8",       "train.val_batches=1",  "train.val_every=0",
               "train.threads=1",   "train.steps=8",       "optim.warmup_steps=2", "checkpoint.keep_last=0"};
  sets.insert(sets.end(), more.begin(), more.end());
  return load_config("", sets);
}

struct Outcome {
  std::vector<TrainSummary> ranks;
  std::string log;
  std::vector<std::string> errors;
};

// Trains c as threads on `hosts` (one per rank); each rank asks to stop after its
// `stop_after`-th save (0: never), as the elastic supervisor would.
Outcome run(const Config& c, const std::vector<std::string>& hosts, const std::string& resume = "", int stop_after = 0) {
  Outcome out;
  out.ranks.resize(hosts.size());
  std::ostringstream log;
  std::vector<int> saves(hosts.size(), 0);
  out.errors = comm::run_threads(int(hosts.size()), {}, [&](comm::World& w) {
    TrainOptions o;
    o.out = o.err = w.global_rank() == 0 ? static_cast<std::ostream*>(&log) : nullptr;
    std::ostringstream sink;
    if (!o.out) o.out = o.err = &sink;
    o.keep_params = true, o.resume = resume;
    const size_t r = size_t(w.global_rank());
    if (stop_after > 0) o.stop_requested = [&saves, r, stop_after] { return ++saves[r] >= stop_after; };
    out.ranks[r] = train(c, o, w);
  }, hosts);
  out.log = log.str();
  return out;
}

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct LostHost {
  const char* name;
  Sets before, after;                          // the layouts, before and after the loss
  std::vector<std::string> hosts, survivors;  // a rank's host, before and after
  std::string lost;
  int held_on;  // the hosts whose stores hold the step when the job resumes
};

// The job saves in memory every 2 steps and stops after step 4 as a loss would find it
// (nothing on disk); `lost` goes with its memory; the job goes on on `survivors` (the same
// global batch by accumulation) from the in-memory step 4, and equals the uninterrupted job's
// disk checkpoint of step 4 resumed by hand on the same layout.
void lost_host(const LostHost& c) {
  SCOPED_TRACE(c.name);
  const std::string root = ::testing::TempDir() + "/memory_ckpt_" + c.lost + std::to_string(c.hosts.size());
  fs::remove_all(root);
  fs::create_directories(root + "/mem");
  auto config = [&](Sets layout, const std::string& dir, bool memory) {
    layout.push_back("checkpoint.dir=" + root + "/" + dir);
    if (memory) layout.insert(layout.end(), {"checkpoint.memory_every=2", "checkpoint.memory_dir=" + root + "/mem"});
    else layout.push_back("checkpoint.save_every=2");
    return small(layout);
  };
  const Config before = config(c.before, "job", true);
  const Outcome first = run(before, c.hosts, "", 2);
  ASSERT_EQ(first.errors, std::vector<std::string>(c.hosts.size()));
  EXPECT_EQ(first.ranks[0].stopped_at, 4);
  EXPECT_TRUE(survey_dir(root + "/job").steps.empty());
  // Every rank file lives on two hosts: its own and its peer's.
  std::map<std::string, int> copies;
  for (const std::string& host : std::set<std::string>(c.hosts.begin(), c.hosts.end()))
    for (const std::string& f : files_of(memory_store_path(before, host) + "/" + shard::step_name(4))) copies[f]++;
  for (size_t r = 0; r < c.hosts.size(); ++r) EXPECT_EQ(copies[shard::rank_file_name(int(r))], 2) << "rank " << r;
  fs::remove_all(memory_store_path(before, c.lost));
  const Outcome resumed = run(config(c.after, "job", true), c.survivors, "auto");
  ASSERT_EQ(resumed.errors, std::vector<std::string>(c.survivors.size()));
  EXPECT_NE(resumed.log.find("resumed from the in-memory checkpoint of step 4 (held on " + std::to_string(c.held_on) +
                             " hosts"),
            std::string::npos)
      << resumed.log;
  EXPECT_EQ(resumed.ranks[0].losses.size(), 4u);
  for (const std::string& host : c.survivors) EXPECT_FALSE(fs::exists(memory_store_path(before, host)));
  ASSERT_EQ(run(config(c.before, "disk", false), c.hosts).errors, std::vector<std::string>(c.hosts.size()));
  const Outcome by_hand = run(config(c.after, "hand", false), c.survivors, root + "/disk/" + shard::step_name(4));
  ASSERT_EQ(by_hand.errors, std::vector<std::string>(c.survivors.size()));
  for (size_t r = 0; r < c.survivors.size(); ++r) {
    EXPECT_EQ(resumed.ranks[r].losses, by_hand.ranks[r].losses) << "rank " << r;
    EXPECT_EQ(resumed.ranks[r].final_params, by_hand.ranks[r].final_params) << "rank " << r;
  }
}

TEST(MemoryCheckpoints, ALostHostsShardsComeFromItsPeersAndTheJobEqualsAByHandResume) {
  // Host a holds its own ranks and b's copies: it alone has the whole step.
  lost_host({"zero1 dp 4 on a, a, b, b -> dp 2 on a, a", {"parallel.dp=4", "parallel.zero=1"},
             {"parallel.dp=2", "parallel.zero=1", "train.grad_accum=2"}, {"a", "a", "b", "b"}, {"a", "a"}, "b", 1});
  // Three hosts, c lost: a and b each lack files the other holds, and fetch them.
  lost_host({"tp 2 x dp 2 on a, b, c, c -> tp 2 on a, b", {"parallel.tp=2", "parallel.dp=2"},
             {"parallel.tp=2", "train.grad_accum=2"}, {"a", "b", "c", "c"}, {"a", "b"}, "c", 2});
}

TEST(MemoryCheckpoints, BothCopiesLostFallsBackToTheDiskAndANewerMemoryStepWins) {
  const std::string root = ::testing::TempDir() + "/memory_ckpt_fallback";
  fs::remove_all(root);
  fs::create_directories(root + "/mem");
  const Config c = small({"parallel.dp=2", "checkpoint.dir=" + root + "/job", "checkpoint.save_every=2",
                          "checkpoint.memory_every=1", "checkpoint.memory_dir=" + root + "/mem"});
  // Saves: step 1 (memory), 2 (disk and memory), 3 (memory): stopped after step 3.
  const Outcome first = run(c, {"a", "b"}, "", 3);
  ASSERT_EQ(first.errors, std::vector<std::string>(2));
  EXPECT_EQ(first.ranks[0].stopped_at, 3);
  EXPECT_EQ(survey_dir(root + "/job").steps, (std::vector<int64_t>{2}));
  // Host a lost: b's store holds both ranks' step 3.
  fs::remove_all(memory_store_path(c, "a"));
  const Outcome again = run(c, {"a", "b"}, "auto", 1);  // a replacement host a, stopped at the next save
  ASSERT_EQ(again.errors, std::vector<std::string>(2));
  EXPECT_NE(again.log.find("in-memory checkpoint of step 3"), std::string::npos) << again.log;
  EXPECT_EQ(again.ranks[0].stopped_at, 4);
  // Both hosts lost: the disk's step 4 is the newest.
  fs::remove_all(memory_store_path(c, "a"));
  fs::remove_all(memory_store_path(c, "b"));
  const Outcome last = run(c, {"a", "b"}, "auto");
  ASSERT_EQ(last.errors, std::vector<std::string>(2));
  EXPECT_NE(last.log.find("resumed from " + root + "/job/" + shard::step_name(4)), std::string::npos) << last.log;
  EXPECT_EQ(last.ranks[0].losses.size(), 4u);
}

TEST(MemoryCheckpoints, AStoreLoomCannotProveItsOwnIsRefusedAndLeftAlone) {
  const std::string root = ::testing::TempDir() + "/memory_ckpt_foreign";
  fs::remove_all(root);
  fs::create_directories(root + "/mem");
  const Config c = small({"checkpoint.dir=" + root + "/job", "checkpoint.memory_every=2",
                          "checkpoint.memory_dir=" + root + "/mem", "train.steps=4"});
  const std::string store = memory_store_path(c, this_host());
  fs::create_directories(store);
  std::ofstream(store + "/notes.txt") << "mine\n";
  TrainOptions o;
  std::ostringstream sink;
  o.out = o.err = &sink;
  try {
    train(c, o);
    FAIL() << "trained into a directory loom did not make";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not this job's in-memory store"), std::string::npos) << e.what();
  }
  EXPECT_EQ(files_of(store), (std::vector<std::string>{"notes.txt"}));
  // One process: one copy, in this host's store, and the store goes at the run's end.
  fs::remove_all(store);
  fs::remove_all(root + "/job");
  const TrainSummary s = train(c, o);
  EXPECT_EQ(s.losses.size(), 4u);
  EXPECT_FALSE(fs::exists(store));
  EXPECT_NE(sink.str().find("in-memory checkpoints: 1 saved"), std::string::npos) << sink.str();
  // A run stopped after its in-memory save of step 2 leaves its store; a fresh run over it
  // (--overwrite) removes it first, so no later --resume auto takes the earlier run's step.
  o.overwrite = true;
  o.stop_requested = [] { return true; };
  EXPECT_EQ(train(c, o).stopped_at, 2);
  EXPECT_TRUE(fs::is_directory(store + "/" + shard::step_name(2)));
  std::ostringstream fresh;
  o.out = o.err = &fresh;
  o.stop_requested = {};
  train(c, o);
  EXPECT_NE(fresh.str().find("not resuming: removed the in-memory checkpoints an earlier run"), std::string::npos)
      << fresh.str();
  EXPECT_FALSE(fs::exists(store));
}

}  // namespace
}  // namespace loom
