// Note [Preflight]: what a rank runs (its build and its config) as two CRC-32s, and the
// refusal a gathered table gives.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <sstream>

#include "loom/ckpt/run_dir.h"
#include "loom/comm/world.h"
#include "loom/core/config.h"
#include "loom/core/elastic.h"
#include "loom/core/error.h"
#include "loom/model/layout.h"
#include "loom/parallel/grad_sync.h"
#include "loom/parallel/rank_plan.h"
#include "loom/train/memory_budget.h"
#include "loom/train/preflight.h"
#include "loom/train/run_start.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

TEST(Preflight, TheSameJobAgreesAndADifferenceNamesTheRankAndItsHost) {
  const Config a = load_config("", {"train.steps=2"}), b = load_config("", {"train.steps=3"});
  const RankIdentity ia = identity_of(a), ib = identity_of(b);
  EXPECT_EQ(ia.build, ib.build);  // one binary
  EXPECT_NE(ia.config, ib.config);
  EXPECT_EQ(identity_of(load_config("", {"train.steps=2"})).config, ia.config);
  // Debian's toolchain links with --build-id: loom's own build is named by it.
  EXPECT_EQ(build_id_hex().size() % 2, 0u);
  EXPECT_FALSE(build_id_hex().empty());
  EXPECT_EQ(preflight_problem({ia, ia, ia}, {"a", "a", "b"}), "");
  const std::string config = preflight_problem({ia, ia, ib}, {"a", "a", "b"});
  EXPECT_NE(config.find("rank 2 on host b was given another config"), std::string::npos) << config;
  EXPECT_EQ(config.find("rank 1"), std::string::npos) << config;
  RankIdentity other = ia;
  other.build ^= 1;
  const std::string build = preflight_problem({ia, other}, {"a", "b"});
  EXPECT_NE(build.find("rank 1 on host b runs another loom build"), std::string::npos) << build;
  EXPECT_NE(build.find("rank 0's"), std::string::npos) << build;
  EXPECT_NE(build.find("on host a"), std::string::npos) << build;
}

// Note [Shared checkpoint directory]: two ranks "on hosts a and b"; rank 0 holds the lock in
// its directory. Where rank 1 reads the same directory the check passes; where it reads one
// of its own (its host's disk), both ranks refuse, naming rank 1 and host b.
TEST(Preflight, ACheckpointDirectoryARankDoesNotSeeIsRefusedOnEveryRank) {
  namespace fs = std::filesystem;
  const std::string a = ::testing::TempDir() + "/preflight_a", b = ::testing::TempDir() + "/preflight_b";
  fs::remove_all(a), fs::remove_all(b), fs::create_directories(b);
  std::vector<std::string> said(2);
  for (const bool shared : {true, false}) {
    const auto errors = comm::run_threads(2, {}, [&](comm::World& w) {
      std::unique_ptr<DirLock> lock;
      if (w.global_rank() == 0) lock = std::make_unique<DirLock>(a);
      int64_t ready = 1;  // rank 0's lock is written before anyone reads it
      w.world_group().all_reduce(std::span<int64_t>(&ready, 1));
      check_shared_dir(w.global_rank() == 0 || shared ? a : b, w.world_group());
    }, {"a", "b"});
    if (shared) {
      EXPECT_EQ(errors, std::vector<std::string>(2));
      continue;
    }
    for (const std::string& e : errors) {
      EXPECT_NE(e.find("' is not one directory for every rank: rank 0 on host a holds its lock there and it is not "
                       "seen by rank 1 on host b"),
                std::string::npos)
          << e;
    }
  }
}

// Note [Host memory preflight]: the estimates of each host's ranks add up against the least
// available memory its ranks read; an unknown reading (0) leaves a host unchecked.
TEST(Preflight, TheRanksOfAHostMustFitItsMemoryTogether) {
  const int64_t gib = int64_t(1) << 30;
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  EXPECT_EQ(host_memory_problem({{3 * gib, 8 * gib, 0}, {3 * gib, 8 * gib, 1}, {3 * gib, 6 * gib, 2}, {3 * gib, 7 * gib, 3}},
                                hosts),
            "");
  const std::string b = host_memory_problem(
      {{3 * gib, 8 * gib, 0}, {3 * gib, 8 * gib, 1}, {3 * gib, 7 * gib, 2}, {4 * gib, 5 * gib, 3}}, hosts);
  EXPECT_NE(b.find("host b runs ranks 2, 3, whose estimates add up to 7.00 GiB (rank 2 3.00 GiB, rank 3 4.00 GiB) "
                   "but it has 5.00 GiB available"),
            std::string::npos)
      << b;
  EXPECT_EQ(b.find("host a"), std::string::npos) << b;
  EXPECT_NE(b.find("run fewer ranks on such a host"), std::string::npos) << b;
  EXPECT_EQ(host_memory_problem({{3 * gib, 0, 0}, {3 * gib, 0, 1}}, {"a", "a"}), "");
  EXPECT_NE(host_memory_problem({{std::numeric_limits<int64_t>::max(), 8 * gib, 0}}, {"a"}).find("rank 0 too much"),
            std::string::npos);
  EXPECT_GT(host_available_bytes(), 0);  // /proc/meminfo is there
}

// Two dp ranks whose host holds one of them but not both: on one host both ranks refuse
// before step 1, naming the host; "on two hosts" (each with that memory) the run trains.
TEST(Preflight, RanksThatFitAloneButNotTogetherAreRefusedBeforeTheFirstStep) {
  const Config c = load_config("", {"parallel.dp=2", "train.steps=1", "train.batch=4", "checkpoint.dir=",
                                    "train.threads=1", "model.layers=2", "model.d_model=256", "model.heads=4",
                                    "model.ffn=1024", "train.val_every=0"});
  std::ostringstream sink;
  TrainOptions o;
  o.out = o.err = &sink;
  auto train_on = [&](const std::vector<std::string>& hosts, int64_t bytes) {
    o.host_memory = [bytes] { return bytes; };
    return comm::run_threads(2, {}, [&](comm::World& w) { train(c, o, w); }, hosts);
  };
  // The estimate each rank states, read back from a refusal: "rank 0 N MiB".
  const std::vector<std::string> tiny = train_on({"a", "a"}, 1);
  const size_t at = tiny[0].find("rank 0 ");
  ASSERT_NE(at, std::string::npos) << tiny[0];
  const int64_t mib = std::stoll(tiny[0].substr(at + 7));
  ASSERT_GE(mib, 3) << tiny[0];  // so that 1.5x the rounded estimate lies between one and two ranks' need
  const int64_t host = 3 * mib * (int64_t(1) << 20) / 2;
  const std::vector<std::string> one_host = train_on({"a", "a"}, host);
  for (const std::string& e : one_host)
    EXPECT_NE(e.find("host a runs ranks 0, 1, whose estimates add up to"), std::string::npos) << e;
  EXPECT_EQ(train_on({"a", "b"}, host), std::vector<std::string>(2));
}

// Note [Elastic shapes]: the re-plan takes the first shape whose ranks fit memory by the
// engine's own estimate. dp 4 x ZeRO-1 (1 MiB buckets) on two slots keeps its split at dp 2,
// whose optimizer pieces are twice as large; under a budget between that and ZeRO-2's need at dp 2 it raises
// the stage (tier 3) instead; so too when the two ranks share a host with room for two ZeRO-2
// ranks only; with room for nothing it refuses, naming the first shape and the budget.
TEST(Preflight, AnElasticReplanTakesTheFirstLayoutWhoseRanksFitMemory) {
  Config c = load_config("", {"parallel.dp=4", "parallel.zero=1", "train.batch=8", "train.grad_accum=1",
                              "model.layers=4", "model.d_model=256", "model.heads=4", "model.ffn=1024", "train.seq=64",
                              "parallel.bucket_mb=1"});
  const ElasticShape kept = elastic_shape(c, 2);
  ASSERT_FALSE(kept.replanned);
  ASSERT_EQ(kept.dp, 2);
  const Config z1 = with_shape(c, kept);
  Config z2 = z1;
  z2.parallel.zero = 2;
  const int64_t need1 = rank_need_bytes(z1, 0), need2 = rank_need_bytes(z2, 0);
  // ZeRO-2 at dp 2 keeps half the gradients (2 bytes a parameter) fewer, less the other half of
  // those not yet reduced at their peak (Note [Unreduced gradients]).
  const int64_t params = ParamLayout(c.model).param_count();
  const RankPlan plan = plan_rank(z2, 0);
  const int64_t unreduced = parallel::unreduced_peak_floats(plan.dp_plan, plan.layout.specs(), true);
  EXPECT_LT(unreduced, params / 2);  // 1 MiB buckets: far from the whole part
  EXPECT_EQ(need1 - need2, 2 * params - 2 * unreduced);
  EXPECT_EQ(rank_need_bytes(z1, 1), need1);
  auto on = [](const std::vector<std::string>& hosts, int64_t available, const Config& x) {
    return [=](const ElasticShape& s) { return layout_memory_problem(with_shape(x, s), hosts, available); };
  };
  const double gib = double(int64_t(1) << 30);
  c.memory.limit_gib = double(need1 + need2) / 2 / gib;
  const ElasticShape raised = elastic_shape(c, 2, on({"a", "b"}, 0, c));
  EXPECT_EQ(raised.problem, "");
  EXPECT_TRUE(raised.replanned);
  EXPECT_EQ(raised.split_text(), "tp 1 pp 1 cp 1 zero 2");
  EXPECT_EQ(raised.dp, 2);
  EXPECT_EQ(raised.grad_accum, 2);
  std::vector<std::string> sets = {"parallel.dp=4", "parallel.zero=1", "train.batch=8", "train.grad_accum=1",
                                   "model.layers=4", "model.d_model=256", "model.heads=4", "model.ffn=1024", "train.seq=64",
                                   "parallel.bucket_mb=1"};
  for (const std::string& s : raised.sets()) sets.push_back(s);
  EXPECT_EQ(load_config("", sets).parallel.zero, 2);  // what the relaunch passes
  EXPECT_FALSE(elastic_shape(c, 4, on({"a", "a", "b", "b"}, 0, c)).replanned);  // dp 4's pieces fit
  // No budget, one host with room for two ZeRO-2 ranks and not two ZeRO-1 ones.
  c.memory.limit_gib = 0;
  EXPECT_EQ(elastic_shape(c, 2, on({"a", "a"}, need1 + need2, c)).split_text(), "tp 1 pp 1 cp 1 zero 2");
  EXPECT_FALSE(elastic_shape(c, 2, on({"a", "b"}, need1 + need2, c)).replanned);  // a host each: kept
  c.memory.limit_gib = 1.0 / 1024;
  const ElasticShape none = elastic_shape(c, 2, on({"a", "b"}, 0, c));
  EXPECT_NE(none.problem.find("slots hold fits; the first (tp 1 pp 1 cp 1, dp 2): rank 0: "), std::string::npos)
      << none.problem;
  EXPECT_NE(none.problem.find("memory.limit_gib allows 1 MiB"), std::string::npos) << none.problem;
}

// Note [Checkpoint room]: a fresh run of 10 steps saving every 3 saves at steps 3, 6, 9 and
// 10; keep_last bounds what is on disk while the last is written; a resume needs the next.
TEST(Preflight, CheckpointRoomCountsTheSavesKeptAtOnce) {
  auto room = [](std::vector<std::string> sets, bool resuming) {
    sets.insert(sets.end(), {"train.steps=10", "model.layers=2", "model.d_model=64", "model.heads=2"});
    return checkpoint_room(load_config("", sets), resuming);
  };
  const Config c = load_config("", {"model.layers=2", "model.d_model=64", "model.heads=2"});
  const double adamw = 12.0 * double(ParamLayout(c.model).param_count());
  const CheckpointRoom three = room({"checkpoint.save_every=3", "checkpoint.keep_last=3"}, false);
  EXPECT_EQ(three.saves, 4);
  EXPECT_EQ(three.at_once, 4);
  EXPECT_DOUBLE_EQ(three.one_bytes, adamw);
  EXPECT_DOUBLE_EQ(three.need_bytes, 4 * adamw);
  EXPECT_EQ(room({"checkpoint.save_every=3", "checkpoint.keep_last=1"}, false).at_once, 2);
  EXPECT_EQ(room({"checkpoint.save_every=3", "checkpoint.keep_last=0"}, false).at_once, 4);
  EXPECT_EQ(room({"checkpoint.save_every=0"}, false).saves, 1);  // the end only
  EXPECT_DOUBLE_EQ(room({"checkpoint.save_every=3", "checkpoint.keep_last=0"}, true).need_bytes, adamw);
  EXPECT_DOUBLE_EQ(room({"optim.name=sgd"}, false).one_bytes, adamw * 2 / 3);
  // 405B parameters' checkpoints do not fit a test machine's disk: refused, naming the room.
  const std::string dir = ::testing::TempDir();
  try {
    check_checkpoint_room(load_config("", {"model.preset=llama3-405b"}), dir, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("preflight (Note [Checkpoint room]): this run's checkpoints (1 saves of at "
                                         "least 4870.24 GB each"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("GB free: free space, lower checkpoint.keep_last"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(check_checkpoint_room(c, dir, false));
}

// Note [Vocabulary passes]: loom simulate prices parallel.pp_vocab; the engine refuses it by
// name (no rank starts a layout it cannot run), and the plain layout still plans.
// Note [Vocabulary passes]: the engine runs the vocabulary split over the pipeline with
// dp, tp (split or replicated vocabulary), sp, cp, ZeRO-1/2/3, offload and every flushing schedule;
// what it does not run yet is refused by name with the fix, before any rank starts.
TEST(Preflight, TheEngineRefusesWhatTheVocabularySplitDoesNotRunYet) {
  const std::vector<std::string> sets = {"parallel.pp=2", "model.layers=2", "train.grad_accum=2",
                                         "parallel.pp_vocab=true"};
  EXPECT_NO_THROW(plan_rank(load_config("", sets), 1));
  std::vector<std::string> sp = sets;
  sp.insert(sp.end(), {"parallel.tp=2", "parallel.sp=true", "parallel.dp=2", "parallel.zero=3"});
  EXPECT_NO_THROW(plan_rank(load_config("", sp), 3));
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"parallel.dp=2", "parallel.ps_servers=1"}, "parallel.ps_servers = 0"},
  };
  for (const auto& [extra, fix] : refused) {
    std::vector<std::string> all = sets;
    all.insert(all.end(), extra.begin(), extra.end());
    try {
      plan_rank(load_config("", all), 0);
      ADD_FAILURE() << extra[0] << ": planned";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("parallel.pp_vocab with"), std::string::npos) << what;
      EXPECT_NE(what.find(fix), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace loom
