// Note [Vocabulary passes] (parallel/schedule.h) priced (sim/vocab_cost.cc): the head, the loss
// and the embedding spread over every pipeline rank leave no floor of unequal stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/sim/cluster.h"
#include "loom/sim/simulator.h"

namespace loom::sim {
namespace {

ClusterSpec free_links(int64_t gpus) {  // the replay's timing is pure schedule and stage work
  return load_cluster("dgx-a100",
                      {"cluster.intra.gbps=1e12", "cluster.inter.gbps=1e12", "cluster.intra.latency_us=0",
                       "cluster.inter.latency_us=0"},
                      gpus, "");
}

SimPlan plan_of(const std::vector<std::string>& sets) {
  // 8 blocks of d_model 2048 and a 256k-row head (about 8 blocks' forward and backward).
  std::vector<std::string> all = {"model.preset=llama", "model.layers=8", "model.d_model=2048", "model.heads=16",
                                  "model.kv_heads=8", "model.ffn=5632", "model.vocab=256000", "parallel.pp=2",
                                  "model.ctx=2048", "train.batch=8", "train.grad_accum=8", "train.seq=2048"};
  all.insert(all.end(), sets.begin(), sets.end());
  SimPlan p;
  p.cfg = load_config("", all);
  return p;
}

// Without the passes the last stage carries the head: a floor well above 20%. With them
// every rank carries half of it: the floor is gone, the step shorter, and the work the
// same (the head's GEMM at half the width, the embedding's lookup now on both ranks).
TEST(VocabPasses, SpreadTheHeadSoNoFloorIsLeft) {
  for (const char* schedule : {"1f1b", "gpipe", "zb-h1", "interleaved"}) {
    std::vector<std::string> sets = {std::string("parallel.schedule=") + schedule};
    if (std::string(schedule) == "interleaved") sets.push_back("parallel.vpp=2");
    const SimResult plain = simulate(plan_of(sets), free_links(2), true);
    sets.push_back("parallel.pp_vocab=true");
    const SimResult vocab = simulate(plan_of(sets), free_links(2), true);
    EXPECT_GT(plain.bubble_floor, 0.2) << schedule;
    EXPECT_LT(vocab.bubble_floor, 0.01) << schedule;
    EXPECT_LT(vocab.step_time_s, plain.step_time_s) << schedule;
    double busy_plain = 0, busy_vocab = 0;
    for (const RankReport& r : plain.ranks) busy_plain += r.busy_s;
    for (const RankReport& r : vocab.ranks) busy_vocab += r.busy_s;
    EXPECT_NEAR(busy_vocab / busy_plain, 1.0, 0.03) << schedule;
    // Every rank runs the m + 2 passes, each at the same time on both.
    std::map<std::string, std::vector<double>> starts;
    for (const SimEvent& e : vocab.events)
      if (e.cat == "pipeline" && e.name[0] == 'V') starts[e.name].push_back(e.t0_s);
    EXPECT_EQ(starts.size(), 10u) << schedule;
    for (const auto& [name, at] : starts) {
      ASSERT_EQ(at.size(), 2u) << schedule << " " << name;
      EXPECT_DOUBLE_EQ(at[0], at[1]) << schedule << " " << name;
    }
  }
}

// The passes' collectives are priced on real links: the last stage's output broadcast, three
// floats a token all-reduced and the input gradient reduced per head; a reduce per lookup
// and a broadcast per gradient (the pipeline's ranks on two nodes here: the inter-node link).
TEST(VocabPasses, PriceTheirCollectivesOverThePipeline) {
  const ClusterSpec c = load_cluster("dgx-a100", {}, 16, "");
  SimPlan p = plan_of({"parallel.pp_vocab=true", "parallel.tp=8", "parallel.pp=2"});
  const SimResult r = simulate(p, c);
  EXPECT_GT(r.breakdown.vocab_comm, 0.0);
  p.cfg.parallel.pp_vocab = false;
  EXPECT_EQ(simulate(p, c).breakdown.vocab_comm, 0.0);
}

// GPT's tied wte: each rank's slice serves its head and its embedding, so no stage keeps the
// whole table's copy: an even split holds the same parameters on both ranks, and the last
// stage half the 50,257 x 768 table (plus the positions, priced on every rank) instead of
// its whole copy.
TEST(VocabPasses, KeepNoCopyOfTheTiedEmbedding) {
  SimPlan p;
  p.cfg = load_config("", {"model.preset=gpt2", "model.layers=4", "parallel.pp=2", "train.batch=4", "train.grad_accum=4",
                           "parallel.pp_vocab=true"});
  const SimResult vocab = simulate(p, free_links(2));
  EXPECT_DOUBLE_EQ(vocab.ranks[0].params, vocab.ranks[1].params);
  p.cfg.parallel.pp_vocab = false;
  const SimResult plain = simulate(p, free_links(2));
  const double wte = 50257.0 * 768, wpe = 1024.0 * 768;
  EXPECT_DOUBLE_EQ(plain.ranks[1].params - vocab.ranks[1].params, wte / 2 - wpe);
}

// Note [Vocabulary passes in a stream]: 2bw with the passes is priced as it runs - the floor
// gone as in the flushing schedules, and (Note [Vocabulary passes ahead]) both it and 1F1B run
// ahead of their passes, so neither idles more than a balanced pipeline's ramp, (pp - 1) / (m +
// pp - 1) of the step. With no pass at its steps' ends (Note [Vocabulary passes across a step's
// end]) the stream keeps most of its gain: its bubble less than half of 1F1B's (1.7% against
// 5.2%; 4.9% while V(-1) and V(m) held every step's end; 0.25%, its floor, since it runs the
// next step's first forwards ahead, below) and its step the shorter, though no shorter than its
// own ramp-free bound, its busiest rank's work.
TEST(VocabPasses, RunInEveryStepOfTwoBw) {
  const SimResult flushing = simulate(plan_of({"parallel.pp_vocab=true"}), free_links(2), true);
  const SimResult stream = simulate(plan_of({"parallel.pp_vocab=true", "parallel.schedule=2bw"}), free_links(2), true);
  EXPECT_LT(stream.bubble_floor, 0.01);
  EXPECT_LT(flushing.bubble_fraction, 1.0 / 9);  // pp 2, m 8
  EXPECT_LT(stream.bubble_fraction, 0.5 * flushing.bubble_fraction);
  EXPECT_LT(stream.step_time_s, flushing.step_time_s);
  double busiest = 0;
  for (const RankReport& r : stream.ranks) busiest = std::max(busiest, r.busy_s);
  EXPECT_GE(stream.step_time_s, busiest);
  int passes = 0;  // the steady step's V(0) .. V(7) on each of the two ranks
  for (const SimEvent& e : stream.events) passes += e.cat == "pipeline" && e.name[0] == 'V';
  EXPECT_EQ(passes, 2 * 8);
}

// Note [The next step's first forwards ahead]: the stream's first stage runs the next step's
// first forward before the step's last pass, so no rank idles at a steady step's ends: the
// bubble is its floor (within half a point), and a forward of the next step's micro-batch 0
// (24, the replay numbering steps k m + i) runs on the first stage inside the steady step.
TEST(VocabPasses, TwoBwRunsTheNextStepsFirstForwardsAhead) {
  const SimResult stream = simulate(plan_of({"parallel.pp_vocab=true", "parallel.schedule=2bw"}), free_links(2), true);
  EXPECT_LT(stream.bubble_fraction, stream.bubble_floor + 0.005);
  bool ahead = false;
  for (const SimEvent& e : stream.events) ahead = ahead || (e.rank == 0 && e.cat == "pipeline" && e.name == "F24");
  EXPECT_TRUE(ahead);
}

TEST(VocabPasses, AreRefusedWhereTheyCannotRun) {
  EXPECT_THROW(load_config("", {"parallel.pp_vocab=true"}), ConfigError);  // pp 1
  EXPECT_THROW(load_config("", {"parallel.pp_vocab=true", "parallel.pp=2", "parallel.schedule=pipedream",
                                "train.grad_accum=1", "model.layers=2"}),
               ConfigError);
  EXPECT_THROW(load_config("", {"parallel.pp_vocab=true", "parallel.pp=2", "parallel.pp_account_loss=true",
                                "model.layers=2"}),
               ConfigError);
}

}  // namespace
}  // namespace loom::sim
