// Note [Rank plan]: plan_rank(config, rank), computed without running anything, is what
// every rank of a live run actually allocates and holds: the model's own carve of its
// layout (every tensor's offset and shape), the groups' ranks, the optimizer's moment
// ranges and sizes. (The engine takes its buckets from the plan itself, so those rows only
// check that it kept them.) Its per-chunk activation peaks, counted from the schedule's
// step order, equal what the simulator's timed replay of the same layout holds.
#include <gtest/gtest.h>

#include "loom/comm/world.h"
#include "loom/engine/engine.h"
#include "loom/train/rank_context.h"
#include "loom/parallel/rank_plan.h"
#include "loom/sim/simulator.h"

namespace loom {
namespace {

bool same(const std::vector<FlatRange>& a, const std::vector<FlatRange>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].offset != b[i].offset || a[i].count != b[i].count) return false;
  return true;
}

TEST(RankPlan, MatchesWhatEveryRankOfALiveRunHolds) {
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.dp=3", "parallel.tp=2", "parallel.pp=2", "train.batch=12", "train.grad_accum=2"},
      {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved", "train.grad_accum=4", "model.layers=4"},
      {"parallel.dp=2", "parallel.zero=3", "parallel.zero_keep=keep*1,shard*3", "model.layers=4"},
      {"parallel.pp=2", "parallel.pp_layers=1,3", "model.layers=4", "parallel.dp=2", "parallel.zero=1",
       "train.grad_accum=2"}};
  for (const auto& layout : layouts) {
    std::vector<std::string> sets = {"model.d_model=64", "model.heads=4", "model.ffn=128", "model.ctx=16",
                                     "train.batch=8", "train.threads=1", "checkpoint.dir="};
    sets.insert(sets.end(), layout.begin(), layout.end());
    const Config cfg = load_config("", sets);
    sim::SimPlan sp;
    sp.framework = sim::Framework::kLoom;
    sp.cfg = cfg;
    const sim::SimResult predicted = sim::simulate(sp, sim::load_cluster("dgx-a100", {"cluster.devices_per_node=" + std::to_string(cfg.parallel.world())}, 0, ""));
    const auto errors = comm::run_threads(int(cfg.parallel.world()), {}, [&](comm::World& w) {
      const RankPlan plan = plan_rank(cfg, w.global_rank());
      RankContext rc = make_rank_context(cfg, &w);
      Engine e(cfg, rc, cfg.micro_batch(), cfg.seq_len());
      Updater u(cfg, e);
      const std::string at = layout[0] + " rank " + std::to_string(w.global_rank());
      EXPECT_EQ(plan.pp_rank, rc.pp_rank) << at;
      EXPECT_EQ(plan.dp_rank, rc.dp_rank) << at;
      EXPECT_EQ(plan.tp_rank, rc.tp_rank) << at;
      EXPECT_EQ(plan.act_slots, rc.act_slots) << at;
      EXPECT_EQ(plan.chunk_peaks, predicted.ranks[size_t(plan.pp_rank)].chunk_in_flight) << at;
      const ParamLayout& held = e.model.layout();
      EXPECT_EQ(plan.layout.total_floats(), held.total_floats()) << at;
      EXPECT_EQ(int64_t(e.model.params().size()), plan.layout.total_floats()) << at;
      ASSERT_EQ(plan.layout.specs().size(), held.specs().size()) << at;
      for (size_t i = 0; i < held.specs().size(); ++i) {
        EXPECT_EQ(plan.layout.specs()[i].name, held.specs()[i].name) << at;
        EXPECT_EQ(plan.layout.specs()[i].offset, held.specs()[i].offset) << at;
        EXPECT_EQ(plan.layout.specs()[i].shape, held.specs()[i].shape) << at;
      }
      EXPECT_TRUE(same(plan.moment_ranges, u.adamw().owned())) << at;
      EXPECT_EQ(int64_t(u.adamw().m().size()), [&] {
        int64_t n = 0;
        for (const FlatRange& r : plan.moment_ranges) n += r.count;
        return n;
      }()) << at;
      EXPECT_EQ(plan.dp_plan.buckets.size(), e.plan.buckets.size()) << at;
      if (cfg.parallel.dp > 1) {
        EXPECT_TRUE(same(plan.dp_plan.owned(plan.dp_rank), e.plan.owned(rc.dp_rank))) << at;
      }
    });
    EXPECT_EQ(errors, std::vector<std::string>(errors.size())) << layout[0];
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

Config duty_config(std::vector<std::string> sets) {
  std::vector<std::string> base = {"model.layers=4", "model.d_model=64", "model.heads=4", "model.ctx=32",
                                   "train.batch=8", "checkpoint.dir="};
  base.insert(base.end(), sets.begin(), sets.end());
  return load_config("", base);
}

// Note [Rank duties]: what each rank does, from the config alone - the gradient path the
// engine's sync takes, the update rule its Updater runs, where its states live - and its
// model-state bytes from the one formula.
TEST(RankPlan, SaysInTypesWhatEachRankDoes) {
  using rank::GradPath, rank::UpdateRule, rank::Place, rank::Role;
  struct Case {
    std::vector<std::string> sets;
    GradPath grad;
    UpdateRule update;
  };
  const std::vector<Case> cases = {
      {{}, GradPath::kNone, UpdateRule::kSynchronous},
      {{"parallel.dp=2"}, GradPath::kAllReduce, UpdateRule::kSynchronous},
      {{"parallel.dp=2", "parallel.zero=1"}, GradPath::kReduceScatter, UpdateRule::kSynchronous},
      {{"parallel.dp=2", "parallel.zero=2"}, GradPath::kShardEveryMicro, UpdateRule::kSynchronous},
      {{"parallel.dp=2", "parallel.zero=2", "parallel.pp=2"}, GradPath::kReduceScatter, UpdateRule::kSynchronous},
      {{"parallel.dp=2", "parallel.zero=3"}, GradPath::kShardEveryMicro, UpdateRule::kSynchronous},
      {{"parallel.dp=2", "parallel.pp=2", "parallel.schedule=2bw", "train.grad_accum=2"}, GradPath::kStreamMean,
       UpdateRule::kTwoBw},
      {{"parallel.pp=2", "parallel.schedule=pipemare", "optim.grad_clip=0"}, GradPath::kNone, UpdateRule::kStream},
      {{"parallel.schedule=2bw"}, GradPath::kNone, UpdateRule::kSynchronous},  // pp 1: plain training
  };
  for (const Case& c : cases) {
    const Config cfg = duty_config(c.sets);
    std::string what;
    for (const std::string& kv : c.sets) what += kv + " ";
    const RankPlan plan = plan_rank(cfg, 0);
    EXPECT_EQ(plan.duties.grad, c.grad) << what;
    EXPECT_EQ(plan.duties.update, c.update) << what;
    EXPECT_EQ(plan.duties.role, Role::kTrainer);
    EXPECT_EQ(plan.state_bytes.total(),
              rank::model_state_bytes(double(plan.layout.param_count()), cfg.parallel.dp, int(cfg.parallel.zero),
                                      rank::engine_widths(cfg.optim)).total());
  }
  const Config ps = duty_config({"parallel.dp=2", "parallel.ps_servers=1"});
  EXPECT_EQ(rank::duties(ps, 1).role, Role::kPsWorker);
  EXPECT_EQ(rank::duties(ps, 1).grad, GradPath::kPsPush);
  EXPECT_EQ(rank::duties(ps, 1).moments, Place::kServers);
  EXPECT_EQ(rank::duties(ps, 2).role, Role::kPsServer);
  EXPECT_EQ(rank::duties(ps, 2).update, UpdateRule::kParameterServer);
  const Config off = duty_config({"offload.optimizer=disk", "offload.params=disk", "offload.dir=/tmp"});
  EXPECT_EQ(rank::duties(off, 0).moments, Place::kOffloadFile);
  EXPECT_EQ(rank::duties(off, 0).params, Place::kOffloadFile);
  EXPECT_EQ(rank::duties(duty_config({"train.precision=bf16"}), 0).precision, Precision::kBf16);
}

}  // namespace
}  // namespace loom
