#include "loom/parallel/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include "loom/core/error.h"

namespace loom::parallel {
namespace {

// Unit-time replay: GPipe and 1F1B both take 2 (m + pp - 1) steps (the bubble is the
// 2 (pp - 1) ramp), while 1F1B holds at most pp - r activations on rank r instead of m.
TEST(Schedule, GPipeAnd1F1BAreDeadlockFreeWithTheKnownMemory) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 12; ++m) {
      const ScheduleCheck g = validate(make_schedule(ScheduleKind::kGPipe, pp, m));
      ASSERT_TRUE(g.ok) << g.problem;
      EXPECT_EQ(g.ticks, 2 * (m + pp - 1)) << "gpipe pp " << pp << " m " << m;
      const ScheduleCheck f = validate(make_schedule(ScheduleKind::k1F1B, pp, m));
      ASSERT_TRUE(f.ok) << f.problem;
      EXPECT_EQ(f.ticks, 2 * (m + pp - 1)) << "1f1b pp " << pp << " m " << m;
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(g.peak_in_flight[r], m);
        EXPECT_EQ(f.peak_in_flight[r], std::min(pp - r, m)) << "pp " << pp << " m " << m << " rank " << r;
      }
    }
}

// Note [PipeDream-2BW]: a step that starts and flushes the stream is 1F1B's list; three
// steps (first, steady, flushing) replay as one 1F1B stream over 3 m micro-batches - no
// bubble between steps (three flushing 1F1B steps take 6 (m + pp - 1) ticks) - holding
// 1F1B's pp - r activations; fewer micro-batches than stages are refused.
TEST(Schedule, TwoBwRunsOneStreamAcrossStepsWithOneFOneBsMemory) {
  for (int pp = 1; pp <= 8; ++pp) {
    for (int m = pp; m <= 16; ++m) {
      const Schedule s = make_schedule(ScheduleKind::k2BW, pp, m);
      const Schedule one = make_schedule(ScheduleKind::k1F1B, pp, m);
      const ScheduleCheck c = validate(s);
      ASSERT_TRUE(c.ok) << c.problem;
      EXPECT_EQ(c.ticks, 2 * (3 * m + pp - 1)) << "2bw pp " << pp << " m " << m;
      for (int r = 0; r < pp; ++r) {
        EXPECT_EQ(c.peak_in_flight[r], pp - r) << "pp " << pp << " m " << m << " rank " << r;
        const std::vector<PipeStep> alone = stream_steps(s, r, 0, true);
        ASSERT_EQ(alone.size(), one.steps[size_t(r)].size());
        for (size_t i = 0; i < alone.size(); ++i) {
          EXPECT_EQ(alone[i].phase, one.steps[size_t(r)][i].phase);
          EXPECT_EQ(alone[i].micro_batch, one.steps[size_t(r)][i].micro_batch);
        }
        // The steady step: m forwards and m backwards, w = pp - r - 1 of them trailing.
        int trailing = 0;
        for (const PipeStep& st : s.steps[size_t(r)]) trailing += st.micro_batch < 0;
        EXPECT_EQ(trailing, pp - r - 1);
        EXPECT_EQ(s.steps[size_t(r)].size(), size_t(2 * m));
      }
    }
    if (pp > 1) EXPECT_THROW(make_schedule(ScheduleKind::k2BW, pp, pp - 1), Error);
  }
}

TEST(Schedule, InterleavedIsDeadlockFreeAndEveryStepRunsOnce) {
  for (int pp = 2; pp <= 4; ++pp)
    for (int vpp = 2; vpp <= 3; ++vpp)
      for (int m = pp; m <= 4 * pp; m += pp) {
        const Schedule s = make_schedule(ScheduleKind::kInterleaved1F1B, pp, m, vpp);
        for (const auto& rank : s.steps) ASSERT_EQ(rank.size(), size_t(2 * m * vpp));
        const ScheduleCheck c = validate(s);
        ASSERT_TRUE(c.ok) << "pp " << pp << " vpp " << vpp << " m " << m << ": " << c.problem;
        // Rank 0 warms up with (pp - 1) * 2 + (vpp - 1) * pp forwards, then holds one more.
        EXPECT_LE(c.peak_in_flight[0], std::min(2 * (pp - 1) + (vpp - 1) * pp + 1, m * vpp));
      }
}

TEST(Schedule, ValidatorNamesTheRanksOfADeadlock) {
  Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 2);
  // Rank 1 wants the gradient of micro-batch 0 before running its forward.
  s.steps[1] = {{Phase::kB, 0, 0}, {Phase::kF, 0, 0}, {Phase::kF, 1, 0}, {Phase::kB, 1, 0}};
  const ScheduleCheck c = validate(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("rank 1 waits to run B0"), std::string::npos) << c.problem;
  Schedule missing = make_schedule(ScheduleKind::kGPipe, 2, 2);
  missing.steps[0].pop_back();
  EXPECT_FALSE(validate(missing).ok);
}

// Zero-bubble schedules for every p and m: each (micro-batch, stage) runs one F, one B and
// one W, W after its B (the validator's replay); W's and B's in micro-batch order on every
// rank (so weight gradients accumulate in 1F1B's order); memory as Qi et al. state it:
// ZB-H1 holds at most 1F1B's peak (pp micro-batches, rank 0's) on any rank with at most
// r + 1 weight gradients pending on rank r; ZB-H2 at most 2 pp - 1, with 2 r + 1 pending.
TEST(Schedule, ZeroBubbleSchedulesFinishWithBoundedMemoryAndOrderedWeightGradients) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m) {
      const ScheduleCheck ref = validate(make_schedule(ScheduleKind::k1F1B, pp, m));
      const int ref_peak = *std::max_element(ref.peak_in_flight.begin(), ref.peak_in_flight.end());
      for (ScheduleKind k : {ScheduleKind::kZbH1, ScheduleKind::kZbH2}) {
        const Schedule s = make_schedule(k, pp, m);
        const ScheduleCheck c = validate(s);
        const std::string at = std::string(schedule_name(k)) + " pp " + std::to_string(pp) + " m " + std::to_string(m);
        ASSERT_TRUE(c.ok) << at << ": " << c.problem;
        for (int r = 0; r < pp; ++r) {
          ASSERT_EQ(s.steps[r].size(), size_t(3 * m)) << at;
          int next[3] = {0, 0, 0};
          for (const PipeStep& st : s.steps[r]) EXPECT_EQ(st.micro_batch, next[int(st.phase)]++) << at << " rank " << r;
          if (k == ScheduleKind::kZbH1) {
            EXPECT_LE(c.peak_in_flight[r], ref_peak) << at << " rank " << r;
            EXPECT_LE(c.peak_pending_w[r], r + 1) << at << " rank " << r;
          } else {
            EXPECT_LE(c.peak_in_flight[r], std::min(2 * pp - 1, m)) << at << " rank " << r;
            EXPECT_LE(c.peak_pending_w[r], 2 * r + 1) << at << " rank " << r;
          }
        }
      }
    }
}

// A ZB-V list finishes, runs F, B and W in micro-batch order per chunk, and holds at most
// 2 pp chunk activations on any rank.
void expect_finishes_in_order_within_memory(const Schedule& s, const std::string& at) {
  const ScheduleCheck c = validate(s);
  ASSERT_TRUE(c.ok) << at << ": " << c.problem;
  for (int r = 0; r < s.pp; ++r) {
    ASSERT_EQ(s.steps[r].size(), size_t(6 * s.micro_batches)) << at;
    int next[2][3] = {{0, 0, 0}, {0, 0, 0}};
    for (const PipeStep& st : s.steps[r]) EXPECT_EQ(st.micro_batch, next[st.chunk][int(st.phase)]++) << at;
    EXPECT_LE(c.peak_in_flight[r], 2 * s.pp) << at << " rank " << r;
  }
}

// ZB-V: chunk 0 of rank r is stage r, chunk 1 stage 2 pp - 1 - r; every p and m finishes
// with F, B and W in micro-batch order per chunk and at most 2 pp chunk activations held
// (1F1B's peak of pp whole-stage micro-batches). Its bubble is the simulator's to check
// (Simulator.ZeroBubbleSchedulesMoveWorkIntoTheBubble), on real step costs.
TEST(Schedule, ZeroBubbleVFinishesWithBoundedMemory) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m) {
      const Schedule s = make_schedule(ScheduleKind::kZbV, pp, m, 2);
      const std::string at = "zb-v pp " + std::to_string(pp) + " m " + std::to_string(m);
      EXPECT_EQ(s.stage(0, 0), 0) << at;
      EXPECT_EQ(s.stage(0, 1), 2 * pp - 1) << at;
      EXPECT_EQ(s.site(pp).rank, pp - 1) << at;
      expect_finishes_in_order_within_memory(s, at);
    }
}

// parallel::replay_time: transfers free, each step its stage's duration (empty work: F = 4,
// B = 5, W = 3 everywhere, the generator's unit cost model).
int replay_ticks(const Schedule& s) { return int(replay_time(s)); }

// ZB-V keeps the shorter of its two list orders: at pp 2, m = 8 each rank has 2 x 8 x 12 =
// 192 ticks of work; B before F ends at 203 (5.4% idle), F before B at 197 (2.5%; 1F1B's
// bubble is 11.1%), and the schedule is the 197-tick one. At pp 8, m = 8 B first ends first.
TEST(Schedule, ZeroBubbleVKeepsTheShorterListOrder) {
  EXPECT_EQ(replay_ticks(make_schedule(ScheduleKind::kZbV, 2, 8, 2)), 197);
  const int pp8 = replay_ticks(make_schedule(ScheduleKind::kZbV, 8, 8, 2));
  EXPECT_GE(pp8, 2 * 8 * 12);
  EXPECT_LT(pp8, 2 * 8 * 12 * 1.25);  // the B-first list's 20% idle at most (seen 16.5%)
}

// Note [ZB-V by stage work]: a heavy last stage (the head: 3 h blocks' forward more) and a
// first stage of no blocks (embedding only: steps of no time) - every pp and m still
// finishes, in micro-batch order per chunk with at most 2 pp chunk activations held (the
// reserve keeps a fast first stage from filling rank 0 with forwards: without it B first
// deadlocks on config B's split).
TEST(Schedule, ZeroBubbleVFinishesOnUnequalStages) {
  for (double h : {0.0, 1.0, 10.0})
    for (int pp = 1; pp <= 6; ++pp)
      for (int m = 1; m <= 12; ++m) {
        StageWork work(static_cast<size_t>(2 * pp), {4, 5, 3});
        work.front() = {0, 0, 0};
        work.back()[0] += 12 * h;  // Note [ZB-V by stage work]: the fused head runs in F
        const std::string at = "h " + std::to_string(h) + " pp " + std::to_string(pp) + " m " + std::to_string(m);
        expect_finishes_in_order_within_memory(make_schedule(ScheduleKind::kZbV, pp, m, 2, false, work), at);
      }
}

// The list built on the stages' durations ends sooner, run on those durations, than the one
// built on equal stages: config B's split at pp 2 (6 blocks as 1, 2, 2, 1; the 50,257-row
// head on the last, 31 blocks' forward with its backward) and config A's (the tiny preset: a
// block a stage, a 256-row head). A stage with no blocks (an embedding-only first stage)
// takes no time.
TEST(Schedule, ZeroBubbleVOnStageWorkEndsSoonerThanOnEqualStages) {
  Config b;
  b.model.arch = Arch::kGpt, b.model.layers = 6, b.model.d_model = 384, b.model.heads = 6, b.model.ffn = 1536;
  b.model.ctx = 256, b.model.vocab = 50257, b.parallel.pp = 2, b.parallel.vpp = 2;
  Config a = b;
  a.model.layers = 4, a.model.d_model = 128, a.model.heads = 4, a.model.ffn = 512;
  a.model.ctx = 128, a.model.vocab = 256;
  for (const Config* cfg : {&b, &a}) {
    const StageWork work = stage_work(*cfg, 2, 2);
    ASSERT_EQ(work.size(), 4u);
    const Schedule on_work = make_schedule(ScheduleKind::kZbV, 2, 8, 2, false, work);
    const Schedule on_units = make_schedule(ScheduleKind::kZbV, 2, 8, 2);
    EXPECT_LT(replay_time(on_work, work), replay_time(on_units, work)) << cfg->model.vocab;
  }
  // B's stage work by hand: a block's forward 2 (d (3 d) + d^2 + 2 d ffn) + 2 s d FLOPs a token,
  // the head's 2 d V.
  const double d = 384, block = 2 * (d * 3 * d + d * d + 2 * d * 1536) + 2 * 256 * d, h = 2 * d * 50257 / block;
  const StageWork w = stage_work(b, 2, 2);
  EXPECT_EQ(w[0], (std::array<double, 3>{4, 5, 3}));
  EXPECT_EQ(w[1], (std::array<double, 3>{8, 10, 6}));
  EXPECT_NEAR(w[3][0], 4 + 12 * h, 1e-9);  // the fused head's forward and backward, in F
  EXPECT_EQ(w[3][1], 5);
  EXPECT_EQ(w[3][2], 3);
  EXPECT_NEAR(h, 10.33, 0.01);
  b.parallel.pp_vocab = true;  // the head runs in the vocabulary passes, on every rank
  EXPECT_EQ(stage_work(b, 2, 2)[3], (std::array<double, 3>{4, 5, 3}));
  b.parallel.pp_layers = {0, 2, 3, 1};  // Note [Stage split]: an embedding-only first stage
  EXPECT_EQ(stage_work(b, 2, 2)[0], (std::array<double, 3>{0, 0, 0}));
  EXPECT_TRUE(stage_work(Config{}, 2, 2).empty());  // no model shape yet: equal stages
}

// With the vocabulary passes (parallel.pp_vocab) the head runs in them, 6 h of work a pass on
// each of the two ranks, and they are barriers; zb-v keeps the list that ends first with them,
// of those with the passes placed by a unit-time replay (on config B's split 1, 2, 2, 1, zb-v's
// default before the vocabulary split balanced the ranks' blocks (Note [Stage split]), the one
// built on equal stages: 884 against 909 units at m = 8; on 2, 2, 1, 1, the default now, the
// one built on the work: 812 against 814) and the one whose passes the list scheduler placed
// (Note [ZB-V with its passes]: 793 on 2, 2, 1, 1).
TEST(Schedule, ZeroBubbleVWithVocabularyPassesKeepsTheListThatEndsFirst) {
  Config b;
  b.model.arch = Arch::kGpt, b.model.layers = 6, b.model.d_model = 384, b.model.heads = 6, b.model.ffn = 1536;
  b.model.ctx = 256, b.model.vocab = 50257, b.parallel.pp = 2, b.parallel.vpp = 2;
  EXPECT_EQ(vocab_pass_work(b, 2), 0.0);  // no vocabulary split: no passes
  b.parallel.pp_vocab = true;
  const double d = 384, block = 2 * (d * 3 * d + d * d + 2 * d * 1536) + 2 * 256 * d, h = 2 * d * 50257 / block;
  EXPECT_NEAR(vocab_pass_work(b, 2), 12 * h / 2, 1e-9);
  for (const std::vector<int64_t>& split : {std::vector<int64_t>{1, 2, 2, 1}, std::vector<int64_t>{2, 2, 1, 1}}) {
    b.parallel.pp_layers = split;
    const StageWork work = stage_work(b, 2, 2);
    const double pass = vocab_pass_work(b, 2);
    Schedule on_work = make_schedule(ScheduleKind::kZbV, 2, 8, 2, false, work);
    add_vocab_passes(on_work);
    const double t_work = replay_time(on_work, work, pass);
    const double t_units = replay_time(make_schedule(ScheduleKind::kZbV, 2, 8, 2, true), work, pass);
    const Schedule placed = zero_bubble_v_with_passes(2, 8, work, pass);
    EXPECT_TRUE(validate(placed).ok) << split[0];
    const double t_placed = replay_time(placed, work, pass);
    const Schedule kept = make_schedule(ScheduleKind::kZbV, 2, 8, 2, true, work, pass);
    EXPECT_TRUE(validate(kept).ok) << split[0];
    EXPECT_EQ(replay_time(kept, work, pass), std::min({t_work, t_units, t_placed})) << split[0];
    if (split[0] == 1) EXPECT_LT(t_units, t_work);  // the choice goes both ways
    else EXPECT_LT(t_work, t_units);
    if (split[0] == 2) EXPECT_LT(t_placed, 0.98 * t_work);
  }
}

// The flushing schedules also try each pass a tick early on the ranks before the last (Note
// [ZB-V by stage work]) and keep it where it ends first: on config M (8 blocks, a 2,048-row
// vocabulary) interleaved at pp 2 the early passes end the step in 428 units against 484
// (simulated bubble 5.6% against 15.9%); on B's zb-h1 the plain place is kept (805 against 883).
TEST(Schedule, VocabularyPassesATickEarlyAreKeptWhereTheyEndFirst) {
  Config c;
  c.model.arch = Arch::kGpt, c.model.layers = 8, c.model.d_model = 384, c.model.heads = 6, c.model.ffn = 1536;
  c.model.ctx = 256, c.model.vocab = 2048, c.parallel.pp = 2, c.parallel.vpp = 2, c.parallel.pp_vocab = true;
  c.parallel.schedule = ScheduleKind::kInterleaved1F1B;
  auto ends = [](const Config& cfg, ScheduleKind kind, int vpp) {
    const StageWork work = stage_work(cfg, 2, vpp);
    const double pass = vocab_pass_work(cfg, 2);
    std::array<double, 3> out{};  // kept, plain place, a tick early
    const Schedule kept = make_schedule(kind, 2, 8, vpp, true, work, pass);
    EXPECT_TRUE(validate(kept).ok);
    out[0] = replay_time(kept, work, pass);
    for (bool early : {false, true}) {
      Schedule s = make_schedule(kind, 2, 8, vpp, false, work);
      add_vocab_passes(s, early);
      EXPECT_TRUE(validate(s).ok) << early;
      out[early ? 2 : 1] = replay_time(s, work, pass);
    }
    return out;
  };
  const std::array<double, 3> m = ends(c, ScheduleKind::kInterleaved1F1B, 2);
  EXPECT_LT(m[2], 0.95 * m[1]);
  EXPECT_EQ(m[0], m[2]);
  c.model.layers = 6, c.model.vocab = 50257, c.parallel.vpp = 1, c.parallel.schedule = ScheduleKind::kZbH1;
  const std::array<double, 3> b = ends(c, ScheduleKind::kZbH1, 1);
  EXPECT_LE(b[1], b[2]);
  EXPECT_EQ(b[0], b[1]);
}

TEST(Schedule, ValidatorRefusesMisplacedWeightGradients) {
  Schedule s = make_schedule(ScheduleKind::kZbH1, 2, 2);
  s.steps[1] = {{Phase::kF, 0, 0}, {Phase::kW, 0, 0}, {Phase::kB, 0, 0},  // W before its B
                {Phase::kF, 1, 0}, {Phase::kB, 1, 0}, {Phase::kW, 1, 0}};
  ScheduleCheck c = validate(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("rank 1 waits to run W0"), std::string::npos) << c.problem;
  Schedule joint = make_schedule(ScheduleKind::k1F1B, 2, 2);
  joint.steps[0].push_back({Phase::kW, 0, 0});  // 1F1B's B already made the weight gradients
  c = validate(joint);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("has no W steps"), std::string::npos) << c.problem;
  Schedule dropped = make_schedule(ScheduleKind::kZbH2, 3, 4);
  dropped.steps[2].pop_back();
  c = validate(dropped);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("never ran the weight gradient of micro-batch 3"), std::string::npos) << c.problem;
}

TEST(Schedule, BadShapesAreRefusedWithAValidChoice) {
  try {
    make_schedule(ScheduleKind::kInterleaved1F1B, 4, 6, 2);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use 8 micro-batches"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 2, 4, 2), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved1F1B, 2, 4, 1), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::kGPipe, 0, 4), Error);
  EXPECT_THROW(make_schedule(ScheduleKind::kZbH1, 2, 4, 2), Error);
}

}  // namespace
}  // namespace loom::parallel
