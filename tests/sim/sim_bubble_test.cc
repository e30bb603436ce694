// Note [Bubble floor] (sim/simulator.h): the bubble unequal stages leave under any schedule,
// and Note [Fused loss backward] (sim/unit_cost.h): loom's last chunk makes the head's
// gradients in its F.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/sim/cluster.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

// Communication free, so the replay's timing is pure schedule and stage work.
ClusterSpec free_links(int64_t gpus) {
  return load_cluster("dgx-a100",
                      {"cluster.intra.gbps=1e12", "cluster.inter.gbps=1e12", "cluster.intra.latency_us=0",
                       "cluster.inter.latency_us=0"},
                      gpus, "");
}

SimPlan plan_of(const std::vector<std::string>& sets, Framework f = Framework::kLoom) {
  std::vector<std::string> all = {"model.preset=gpt-22b", "model.layers=8", "model.vocab=256", "parallel.pp=2",
                                  "train.batch=8", "train.grad_accum=8"};
  all.insert(all.end(), sets.begin(), sets.end());
  SimPlan p;
  p.cfg = load_config("", all);
  p.framework = f;
  return p;
}

TEST(BubbleFloor, IsOneLessEveryRanksWorkOverTheBusiestRanksTimesTheRanks) {
  EXPECT_DOUBLE_EQ(bubble_floor(4 + 5, 5, 2), 0.1);  // stages of 4 and 5 s
  EXPECT_DOUBLE_EQ(bubble_floor(3 * 2.0, 2.0, 3), 0.0);
  EXPECT_DOUBLE_EQ(bubble_floor(0, 0, 2), 0.0);  // no pipeline work
}

// Stages of 3 and 5 of 8 equal blocks (a 256-row head and the embedding are ~0.1% of a block
// here): every rank's window holds at least the 5-block rank's work, so no schedule's bubble
// goes below 1 - 8 / (2 x 5) = 20%; on the even split the floor is ~0 and only the
// schedule's own bubble is left.
TEST(Simulator, NoScheduleGoesBelowTheFloorOfUnequalStages) {
  for (const char* split : {"parallel.pp_layers=3,5", "parallel.pp_layers=4,4"}) {
    const double floor = std::string(split).find("3,5") != std::string::npos ? 0.2 : 0.0;
    for (const char* schedule : {"1f1b", "gpipe", "zb-h1", "zb-h2", "2bw"}) {
      const SimResult r = simulate(plan_of({split, std::string("parallel.schedule=") + schedule}), free_links(2));
      EXPECT_NEAR(r.bubble_floor, floor, 0.005) << split << " " << schedule;
      EXPECT_GE(r.bubble_fraction, r.bubble_floor - 1e-9) << split << " " << schedule;
    }
  }
}

// Note [Measured bubble]: 2bw's steady step updates inside the stream, so its update is work
// of category "update" that counts as busy in the bubble and the floor, ending where
// RankReport::update_end_s says; 1F1B's update follows its drain, an "optimizer" span outside.
// Note [2BW's update in the waits]: the first stage (3 blocks against 5, and a stash) writes its
// update in its waits before its backwards ("U wait" spans, each inside one such wait, none
// over a pipeline step) and runs only what does not fit at the step's end ("U"); the last
// stage holds no stash and updates at the end.
TEST(Simulator, TwoBwsUpdateCountsAsBusyInsideTheStream) {
  const SimResult two = simulate(plan_of({"parallel.schedule=2bw", "parallel.pp_layers=3,5"}), free_links(2), true);
  double busy = 0, most = 0, end = 0;
  for (const RankReport& r : two.ranks) {
    ASSERT_GT(r.optimizer_s, 0);
    double at_end = 0, in_waits = 0;
    int waits = 0;
    for (const SimEvent& e : two.events) {
      if (e.rank != r.global_rank || e.cat != "update") continue;
      ASSERT_TRUE(e.name == "U" || e.name == "U wait") << e.name;
      if (e.name == "U") {
        EXPECT_DOUBLE_EQ(e.t1_s, r.update_end_s);
        EXPECT_GE(e.t0_s, r.pipeline_end_s);
        at_end += e.t1_s - e.t0_s;
        continue;
      }
      ++waits, in_waits += e.t1_s - e.t0_s;
      EXPECT_LE(e.t1_s, r.pipeline_end_s);
      for (const SimEvent& p : two.events)
        if (p.rank == r.global_rank && p.cat == "pipeline") EXPECT_TRUE(e.t1_s <= p.t0_s || e.t0_s >= p.t1_s) << p.name;
    }
    EXPECT_NEAR(at_end + in_waits, r.optimizer_s, 1e-12) << r.pp_rank;
    EXPECT_GE(r.update_end_s, r.pipeline_end_s + at_end - 1e-12) << r.pp_rank;
    if (r.pp_rank == 0) EXPECT_GT(waits, 0);
    else EXPECT_EQ(waits, 0) << "the last stage holds no stash";
    if (r.pp_rank == 1) EXPECT_GT(r.update_end_s, r.pipeline_end_s);
    busy += r.busy_s + r.optimizer_s, most = std::max(most, r.busy_s + r.optimizer_s);
    end = std::max(end, r.update_end_s);
  }
  EXPECT_NEAR(two.bubble_fraction, 1 - busy / (2 * end), 1e-12);
  EXPECT_NEAR(two.bubble_floor, bubble_floor(busy, most, 2), 1e-12);
  const SimResult flushing = simulate(plan_of({"parallel.pp_layers=3,5"}), free_links(2), true);
  for (const RankReport& r : flushing.ranks) EXPECT_EQ(r.update_end_s, 0);
  for (const SimEvent& e : flushing.events) EXPECT_NE(e.cat, "update");
}

// Note [Stage split]: a last stage that only runs the (256-row) head carries almost no work,
// so the floor is that of 8 blocks on one rank of two, 1 - 8 / (2 x 8) = 50%; Megatron's
// accounted split is priced as the explicit split it resolves to (8 + 1 over 2 = 5, 4; the
// last gives one to the loss: 5, 3).
TEST(Simulator, PricesStagesWithoutBlocksAndTheAccountedSplit) {
  const SimResult head_only = simulate(plan_of({"parallel.pp_layers=8,0"}), free_links(2));
  EXPECT_NEAR(head_only.bubble_floor, 0.5, 0.005);
  const SimResult accounted = simulate(plan_of({"parallel.pp_account_loss=true"}), free_links(2));
  const SimResult explicit_split = simulate(plan_of({"parallel.pp_layers=5,3"}), free_links(2));
  EXPECT_DOUBLE_EQ(accounted.step_time_s, explicit_split.step_time_s);
  EXPECT_DOUBLE_EQ(accounted.bubble_floor, explicit_split.bubble_floor);
  EXPECT_NEAR(accounted.bubble_floor, 1 - 8.0 / (2 * 5), 0.005);
  ASSERT_EQ(accounted.ranks.size(), explicit_split.ranks.size());
  for (size_t r = 0; r < accounted.ranks.size(); ++r)
    EXPECT_DOUBLE_EQ(accounted.ranks[r].memory.total(), explicit_split.ranks[r].memory.total()) << "rank " << r;
}

// Per pipeline rank and step kind (F / B), the mean duration of its steps in the trace.
std::map<std::pair<int64_t, char>, double> step_means(const SimResult& r) {
  std::map<std::pair<int64_t, char>, std::pair<double, int>> sum;
  for (const SimEvent& e : r.events)
    if (e.cat == "pipeline" && !e.name.empty()) {
      auto& [t, n] = sum[{e.rank, e.name[0]}];
      t += e.t1_s - e.t0_s, ++n;
    }
  std::map<std::pair<int64_t, char>, double> out;
  for (const auto& [k, v] : sum) out[k] = v.first / v.second;
  return out;
}

// GPT-2's 50,257-row head on the last of two even stages: under --framework loom its whole
// backward sits in the last rank's F, so that F exceeds the first rank's by what Megatron's F
// and B together exceed them by (the head's forward and backward; the frameworks' other
// differences, e.g. dropout, are the same on both stages), and the last B is the first's
// (less the embedding's small backward). Under Megatron the head's backward is in the B.
TEST(Simulator, LoomPricesTheHeadsBackwardInTheLastStagesForward) {
  std::map<Framework, std::map<std::pair<int64_t, char>, double>> t;
  for (Framework f : {Framework::kLoom, Framework::kMegatron})
    t[f] = step_means(simulate(plan_of({"model.vocab=50257"}, f), free_links(2), true));
  const auto& loom = t[Framework::kLoom];
  const auto& mega = t[Framework::kMegatron];
  ASSERT_EQ(loom.size(), 4u);
  ASSERT_EQ(mega.size(), 4u);
  EXPECT_NEAR(loom.at({1, 'B'}), loom.at({0, 'B'}), 0.02 * loom.at({0, 'B'}));
  const double head_f = mega.at({1, 'F'}) - mega.at({0, 'F'}), head_b = mega.at({1, 'B'}) - mega.at({0, 'B'});
  EXPECT_GT(head_b, 0.1 * mega.at({0, 'B'}));
  EXPECT_NEAR(loom.at({1, 'F'}) - loom.at({0, 'F'}), head_f + head_b, 0.05 * (head_f + head_b));
}

// Note [ZB-V by stage work]: with a GPT-2-sized head (50,257 rows, made forward and backward
// in the last stage's F: Note [Fused loss backward]) the list built on the stages' own
// durations reaches the floor of the unequal stages at pp 2 and m 8 (built as if the stages
// were equal it was 1.4 points over: 8.1% against 6.7%).
TEST(BubbleFloor, ZeroBubbleVOnStageWorkReachesIt) {
  const SimResult r = simulate(plan_of({"parallel.vpp=2", "parallel.schedule=zb-v", "model.vocab=50257"}), free_links(2));
  EXPECT_GT(r.bubble_floor, 0.05);  // the head makes the stages unequal
  EXPECT_LT(r.bubble_fraction - r.bubble_floor, 0.005);
}

// With the vocabulary split (parallel.pp_vocab) the head runs in the passes, every rank's
// share alike, and the V's stages are blocks only; on plan_of's 8 blocks over 4 virtual
// stages split 1, 3, 3, 1 (rank 0 two blocks, rank 1 six) the list built on those blocks
// left the passes out of its choice; zb-v now keeps the list that ends first with them
// (parallel::replay_time), which reaches the floor.
TEST(BubbleFloor, ZeroBubbleVWithTheVocabularySplitReachesIt) {
  const SimResult r = simulate(plan_of({"parallel.vpp=2", "parallel.schedule=zb-v", "model.vocab=50257",
                                        "parallel.pp_vocab=true", "parallel.pp_layers=1,3,3,1"}),
                               free_links(2));
  EXPECT_GT(r.bubble_floor, 0.05);
  EXPECT_LT(r.bubble_fraction - r.bubble_floor, 0.005);
}

}  // namespace
}  // namespace loom::sim
