// Parameter-server workers that are tensor- and pipeline-parallel groups (Note [Parameter
// server with model parallelism] in modes/ps/ps.h): the server placement, synchronous
// training against the single-process run with shuffled arrivals, and async / ssp pushes
// applied consistently by every shard's servers.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/parallel/rank_plan.h"
#include "loom/train/verify.h"
#include "support/error_message.h"
#include "support/ps_applied.h"
#include "support/tiny_sets.h"
#include "support/train_threads.h"

namespace loom {
namespace {

using Sets = std::vector<std::string>;

Config base(const Sets& extra) {
  Sets sets = testing_support::tiny_sets(
      {"model.ctx=32", "train.steps=6", "train.val_every=3", "optim.grad_clip=0.3"});
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

// dp 2 x tp 2 x pp 2 + 3 servers per shard: 8 workers, 12 servers; shard c = pp x tp + tp
// has servers 8 + 3c .. 8 + 3c + 2, and a server's plan is its shard's dp-0 worker's layout
// with its key range (the partition of that layout), at checkpoint coordinates dp + index.
TEST(PsModelParallel, EachShardHasItsOwnServersOverItsLayout) {
  const Config c = base({"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.ps_servers=3"});
  const ParallelConfig& p = c.parallel;
  ASSERT_EQ(p.ranks(), 20);
  EXPECT_EQ(p.shape_text(), "dp x tp x pp = 2 x 2 x 2 + 12 servers (3 per tp x pp shard)");
  EXPECT_EQ(p.dp_for(20), 2);
  EXPECT_EQ(p.dp_for(7), 0);
  for (int r = 0; r < 8; ++r) {
    const RankPlan w = plan_rank(c, r);
    const int shard = rank::ps_shard_of(p, r);
    EXPECT_EQ(shard, w.pp_rank * 2 + w.tp_rank) << "worker " << r;
    for (int s : rank::ps_servers_of(p, shard)) EXPECT_EQ(rank::ps_place(p, s).shard, shard);
  }
  for (int r = 8; r < 20; ++r) {
    const rank::PsPlace at = rank::ps_place(p, r);
    EXPECT_EQ(at.shard, (r - 8) / 3);
    EXPECT_EQ(at.index, (r - 8) % 3);
    const RankPlan server = plan_rank(c, r), worker = plan_rank(c, at.worker);
    EXPECT_EQ(worker.dp_rank, 0);
    EXPECT_EQ(server.pp_rank * 2 + server.tp_rank, at.shard);
    EXPECT_EQ(server.dp_rank, 2 + at.index);
    EXPECT_EQ(server.layout.total_floats(), worker.layout.total_floats());
    ASSERT_EQ(server.param_ranges.size(), 1u);
    const FlatRange own = rank::ps_partition(worker.layout.total_floats(), 3)[size_t(at.index)];
    EXPECT_EQ(server.param_ranges[0].offset, own.offset);
    EXPECT_EQ(server.param_ranges[0].count, own.count);
    EXPECT_EQ(server.duties.role, rank::Role::kPsServer);
    // The last stage's servers leave GPT's tied wte copy (the layout's first tensor) out.
    const std::vector<FlatRange> saved = ps_saved_ranges(server, c.model);
    if (server.pp_rank == 0) {
      ASSERT_EQ(saved.size(), 1u);
      EXPECT_EQ(saved[0].count, own.count);
      continue;
    }
    const ParamSpec& wte = server.layout.at("wte");
    for (const FlatRange& x : saved) EXPECT_GE(x.offset, wte.offset + wte.numel) << "server " << r;
  }
}

// Sync PS over tp 2 (+ sp), pp 2 (GPT's tied wte on both ends) and dp 2 x tp 2 x pp 2 is the
// single-process run with the same global batch within loom verify's tolerances, with every
// push delayed a random few milliseconds so they reach the servers in shuffled order; every
// worker ends with the same whole weights and the servers report no losses.
TEST(PsModelParallel, SyncEqualsTheSingleProcessRunWithShuffledArrivals) {
  const TrainSummary ref = testing_support::train_keeping_params(base({}))[0];
  for (const Sets& layout : std::vector<Sets>{
           {"parallel.dp=2", "parallel.tp=2", "parallel.sp=true", "parallel.ps_servers=2"},
           {"parallel.dp=2", "parallel.pp=2", "parallel.ps_servers=1", "train.grad_accum=2"},
           {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.ps_servers=1", "train.grad_accum=2"}}) {
    const Config c = base(layout);
    const std::vector<TrainSummary> got = testing_support::train_as_threads(c, testing_support::shuffled_arrivals());
    const std::string name = layout[1] + " " + layout[2];
    for (int w = 0; w < int(c.parallel.world()); ++w) {
      const VerifyRow row = compare_runs(name, ref, got[size_t(w)], tolerance_for(c));
      EXPECT_TRUE(row.ok) << name << " worker " << w << ": " << row.error << " loss rel " << row.max_loss_rel
                          << ", weight " << row.max_weight_abs;
      EXPECT_EQ(got[size_t(w)].final_params, got[0].final_params) << name << " worker " << w;
    }
    for (size_t s = size_t(c.parallel.world()); s < got.size(); ++s) EXPECT_TRUE(got[s].losses.empty()) << name;
  }
}

// Async and ssp with a slow replica over tp 2 and over pp 2 (GPT: the last stage takes the
// first stage's tied wte after each pull): every server of every shard applies the same
// pushes, each replica's clocks in order, exactly W x steps of them (Note [Exact push
// count] with one leader for all shards); every rank of a replica made the same number of
// pushes (they agree on "stop"), and the replica trains.
TEST(PsModelParallel, FreeRunningShardsApplyTheSamePushes) {
  for (const Sets& layout : std::vector<Sets>{{"parallel.tp=2", "ps.mode=async", "parallel.ps_servers=2"},
                                              {"parallel.pp=2", "ps.mode=ssp", "ps.staleness=1", "parallel.ps_servers=1"}}) {
    const std::string name = layout[0] + " " + layout[1];
    Sets sets = layout;
    sets.insert(sets.end(), {"parallel.dp=2", "ps.slow_worker=1", "ps.slow_factor=3", "train.steps=8",
                             "memory.limit_gib=64"});
    const Config c = base(sets);
    testing_support::Applied a;
    const std::vector<TrainSummary> got = testing_support::train_as_threads(c, a.options());
    const int W = 2, ranks = int(c.parallel.world());
    const std::vector<int64_t> next = a.expect_same_pushes(W, int(c.parallel.servers()), 8, name);
    for (int r = 0; r < ranks; ++r) {
      const RankPlan plan = plan_rank(c, r);
      EXPECT_GE(got[size_t(r)].ps_worker_pushes, next[size_t(plan.dp_rank)]) << name << " rank " << r;
      EXPECT_LE(got[size_t(r)].ps_worker_pushes, next[size_t(plan.dp_rank)] + 1) << name << " rank " << r;
      EXPECT_EQ(got[size_t(r)].ps_pushes, W * 8) << name << " rank " << r;
    }
    if (c.ps.mode == PsMode::kSsp) EXPECT_LE(a.most_stale, 1) << name;
    ASSERT_FALSE(got[0].losses.empty()) << name;
    EXPECT_LT(got[0].losses.back(), got[0].losses.front()) << name;
    EXPECT_GT(got[0].final_val_loss, 0) << name;
  }
}

// What a PS job with model-parallel workers refuses, each naming what works instead.
TEST(PsModelParallel, RefusesWhatItCannotRun) {
  auto error = [](const Sets& sets) { return testing_support::error_message([&] { base(sets); }); };
  EXPECT_NE(error({"parallel.ps_servers=1", "parallel.pp=2", "parallel.schedule=2bw"})
                .find("2bw updates each stage inside the pipeline's stream, while the servers hold the update"),
            std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=1", "parallel.tp=2", "model.arch=llama", "ps.sparse_embedding=true"})
                .find("set parallel.tp = parallel.pp = 1 or ps.sparse_embedding = false"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
