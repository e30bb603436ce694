// Note [Vocabulary passes]: every flushing schedule with the passes inserted finishes, keeps
// the memory of its lists without them, runs the passes in one order on every rank, and
// carries each micro-batch's embedding lookup and gradient once; 2bw's steps likewise (Note
// [Vocabulary passes in a stream]). 1f1b's and 2bw's lists may run further ahead with the
// passes (Note [Vocabulary passes ahead]).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::parallel {
namespace {

// A rank's list as "V-1 F0 ... ".
std::string text(const std::vector<PipeStep>& list) {
  std::string out;
  for (const PipeStep& st : list) out += phase_letter(st.phase) + std::to_string(st.micro_batch) + " ";
  return out;
}

struct Kind {
  ScheduleKind kind;
  int vpp;
};

// Every micro-batch's embedding lookup and gradient ride in exactly one pass each.
void expect_each_embedding_once(const Schedule& s, int m, const std::string& what) {
  std::vector<int> embeds(size_t(m), 0), grads(size_t(m), 0);
  for (const VocabPass& v : s.passes) {
    for (int j : v.embed) ++embeds[size_t(j)];
    for (int j : v.embed_grad) ++grads[size_t(j)];
  }
  EXPECT_EQ(embeds, std::vector<int>(size_t(m), 1)) << what;
  EXPECT_EQ(grads, std::vector<int>(size_t(m), 1)) << what;
}

TEST(VocabPasses, EveryFlushingScheduleFinishesWithTheSameMemory) {
  const Kind kinds[] = {{ScheduleKind::kGPipe, 1},  {ScheduleKind::k1F1B, 1}, {ScheduleKind::kInterleaved1F1B, 2},
                        {ScheduleKind::kZbH1, 1},   {ScheduleKind::kZbH2, 1}, {ScheduleKind::kZbV, 2}};
  for (const Kind& k : kinds)
    for (int pp = 2; pp <= 4; ++pp)
      for (int m = 1; m <= 9; ++m) {
        if (k.kind == ScheduleKind::kInterleaved1F1B && m % pp != 0) continue;
        const std::string what = std::string(schedule_name(k.kind)) + " pp " + std::to_string(pp) + " m " +
                                 std::to_string(m);
        const Schedule s = make_schedule(k.kind, pp, m, k.vpp, true);
        // The lists between the passes: 1F1B's at the lag rule they run ahead by, the others' own.
        const Schedule plain = k.kind == ScheduleKind::k1F1B ? make_lagged(k.kind, pp, m, s.lag)
                                                             : make_schedule(k.kind, pp, m, k.vpp);
        const ScheduleCheck a = validate(plain), b = validate(s);
        ASSERT_TRUE(b.ok) << what << ": " << b.problem;
        EXPECT_EQ(b.peak_in_flight, a.peak_in_flight) << what;
        EXPECT_EQ(b.peak_pending_w, a.peak_pending_w) << what;
        ASSERT_EQ(s.passes.size(), size_t(m + 2)) << what;
        expect_each_embedding_once(s, m, what);
        for (int r = 0; r < pp; ++r) {
          // The other steps in their order, and V(-1) .. V(m) in theirs.
          std::vector<PipeStep> rest;
          int next_pass = -1;
          for (const PipeStep& st : s.steps[size_t(r)])
            if (st.phase == Phase::kV) EXPECT_EQ(st.micro_batch, next_pass++) << what << " rank " << r;
            else rest.push_back(st);
          EXPECT_EQ(next_pass, m + 1) << what;
          ASSERT_EQ(rest.size(), plain.steps[size_t(r)].size()) << what;
          for (size_t i = 0; i < rest.size(); ++i)
            EXPECT_TRUE(rest[i].phase == plain.steps[size_t(r)][i].phase &&
                        rest[i].micro_batch == plain.steps[size_t(r)][i].micro_batch &&
                        rest[i].chunk == plain.steps[size_t(r)][i].chunk)
                << what << " rank " << r << " step " << i;
        }
      }
}

// 1F1B at pp 2, m 4, rank 0 one forward further ahead (Note [Vocabulary passes ahead]: its
// warm-up 2) and its passes a tick earlier: between V(i) and V(i + 1) it runs B(i - 1), whose
// gradient rank 1 sent before V(i), and F(i + 2), which rank 1 forwards after V(i + 1): nothing
// waits on a pass. Lookups ride in the last pass before the first stage's F, gradients in the
// first after its B.
TEST(VocabPasses, OneFOneBCarriesTheEmbeddingInThePassesAroundTheFirstStage) {
  const Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 4, 1, true);
  EXPECT_EQ(pipeline_lag(s, 0), 2);
  EXPECT_EQ(text(s.steps[0]), "V-1 F0 V0 F1 F2 V1 B0 F3 V2 B1 V3 B2 B3 V4 ");
  EXPECT_EQ(text(s.steps[1]), "V-1 F0 V0 B0 F1 V1 B1 F2 V2 B2 F3 V3 B3 V4 ");
  const std::vector<std::vector<int>> embed = {{0}, {1, 2}, {3}, {}, {}, {}}, grad = {{}, {}, {}, {0}, {1}, {2, 3}};
  for (size_t k = 0; k < s.passes.size(); ++k) {
    EXPECT_EQ(s.passes[k].head, k >= 1 && k <= 4 ? int(k) - 1 : -1) << k;
    EXPECT_EQ(s.passes[k].embed, embed[k]) << k;
    EXPECT_EQ(s.passes[k].embed_grad, grad[k]) << k;
  }
}

// The buffers the first stage holds for the embedding (vocab_buffers): 1F1B at pp 2, m 4 holds
// the two lookups of V0 before F1 and F2, and V4's two gradients of B2 and B3; GPipe holds the
// four gradients of its backwards until V(4). Every other rank one, for the lookup it sums onto
// the first stage.
TEST(VocabPasses, TheFirstStageHoldsItsLookupsAndGradientsInFlight) {
  const Schedule one = make_schedule(ScheduleKind::k1F1B, 2, 4, 1, true);
  EXPECT_EQ(vocab_buffers(one, 0), 2);
  EXPECT_EQ(vocab_buffers(one, 1), 1);
  const Schedule gpipe = make_schedule(ScheduleKind::kGPipe, 2, 4, 1, true);
  EXPECT_EQ(vocab_buffers(gpipe, 0), 4);
  EXPECT_EQ(vocab_buffers(gpipe, 1), 1);
}

// Note [Vocabulary passes in a stream]: every kind of 2bw step (age 0 or older, flushing or
// not) runs its plain steps in their order with its passes among them in order; along a stream
// (a lone flushing step, and ages 0 .. 3 with the last flushing) the first stage looks each
// micro-batch up once, before its forward, and carries each embedding gradient once, after
// its backward and in the order of the backwards, across the steps' ends too (Note [Vocabulary
// passes across a step's end]); the stream of them finishes with the memory of the plain one.
TEST(VocabPasses, EveryKindOfTwoBwStepCarriesItsOwnEmbedding) {
  for (int pp = 2; pp <= 4; ++pp)
    for (int m = pp; m <= 8; ++m) {
      const std::string what = "pp " + std::to_string(pp) + " m " + std::to_string(m);
      const Schedule s = make_schedule(ScheduleKind::k2BW, pp, m, 1, true);
      const Schedule plain = make_lagged(ScheduleKind::k2BW, pp, m, s.lag);  // its lists without passes
      const ScheduleCheck c = validate(s);
      ASSERT_TRUE(c.ok) << what << ": " << c.problem;
      EXPECT_EQ(c.peak_in_flight, validate(plain).peak_in_flight) << what;
      const std::vector<VocabPass>& steady = stream_passes(s, 1, false);  // neither V(-1) nor V(m)
      EXPECT_TRUE(steady.front().carries_nothing() && steady.back().carries_nothing()) << what;
      for (int steps : {1, 4}) {
        std::vector<int> looked, forwarded, made, carried;  // stream positions k m + j, in order
        // Per rank, the steps other than passes along the stream and along the plain one (positions
        // k m + j): the same, though a step may run the next one's first forwards (Note [The next
        // step's first forwards ahead]).
        std::vector<std::vector<std::pair<Phase, int>>> ran(static_cast<size_t>(pp)), wanted = ran;
        for (int age = 0; age < steps; ++age) {
          const bool flush = age == steps - 1;
          const std::string kind = what + " age " + std::to_string(age) + (flush ? " flush" : "");
          const std::vector<VocabPass>& passes = stream_passes(s, age, flush);
          ASSERT_EQ(passes.size(), size_t(m + 2)) << kind;
          for (int r = 0; r < pp; ++r) {
            std::vector<PipeStep> rest;
            int last_pass = -2;
            for (const PipeStep& st : stream_steps(s, r, age, flush)) {
              if (st.phase != Phase::kV) {
                rest.push_back(st);
                if (r == 0 && st.phase == Phase::kF) forwarded.push_back(age * m + st.micro_batch);
                if (r == 0 && st.phase == Phase::kB) made.push_back(age * m + st.micro_batch);
                continue;
              }
              EXPECT_GT(st.micro_batch, last_pass) << kind << " rank " << r;
              last_pass = st.micro_batch;
              if (r > 0) continue;
              const VocabPass& p = passes[size_t(st.micro_batch + 1)];
              for (int j : p.embed_grad) {
                carried.push_back(age * m + j);
                EXPECT_TRUE(std::find(made.begin(), made.end(), age * m + j) != made.end()) << kind << " G" << j;
              }
              for (int j : p.embed) looked.push_back(age * m + j);
            }
            for (const PipeStep& st : rest) ran[size_t(r)].emplace_back(st.phase, age * m + st.micro_batch);
            for (const PipeStep& st : stream_steps(plain, r, age, flush))
              wanted[size_t(r)].emplace_back(st.phase, age * m + st.micro_batch);
          }
          for (int f : forwarded)  // looked up before its forward (in an earlier pass or step)
            EXPECT_TRUE(std::find(looked.begin(), looked.end(), f) != looked.end()) << kind << " F" << f;
        }
        std::vector<int> all(size_t(steps * m));
        for (int i = 0; i < steps * m; ++i) all[size_t(i)] = i;
        EXPECT_EQ(ran, wanted) << what << ", " << steps << " steps";
        EXPECT_EQ(looked, all) << what << ", " << steps << " steps";
        EXPECT_EQ(forwarded, all) << what << ", " << steps << " steps";
        EXPECT_EQ(carried, made) << what << ", " << steps << " steps";
      }
    }
}

// pp 2, m 4, a steady step, the first stage two micro-batches behind (Note [Vocabulary passes
// ahead]): its trailing backwards B(-2), B(-1) (the step before's micro-batches 2 and 3) run
// after F0 and F1, so V0 and V1 carry their gradients with micro-batches 2's and 3's lookups.
// F0 ran in the step before, ahead of its V3 (Note [The next step's first forwards ahead]), so
// this step starts at B(-2) and ends with the next step's F0 (as F4) before V3: V2 makes that
// lookup after the vocabulary tensors' update, aside, and V3 the next step's F1's (5) after
// taking it, once its head read the tensors of before; no V(-1) opens the step and no V(4) ends
// it. A flush keeps its V(4) and runs no forward of the next step.
TEST(VocabPasses, ASteadyTwoBwStepCarriesTheStepBeforesLastGradient) {
  const Schedule s = make_schedule(ScheduleKind::k2BW, 2, 4, 1, true);
  EXPECT_EQ(text(stream_steps(s, 0, 1, false)), "B-2 F1 V0 B-1 F2 V1 B0 F3 V2 B1 F4 V3 ");
  EXPECT_EQ(text(stream_steps(s, 1, 1, false)), "F0 V0 B0 F1 V1 B1 F2 V2 B2 F3 V3 B3 ");
  const std::vector<VocabPass>& p = stream_passes(s, 1, false);
  EXPECT_TRUE(p[0].carries_nothing() && p[5].carries_nothing());
  EXPECT_EQ(p[1].embed_grad, std::vector<int>{-2});
  EXPECT_EQ(p[1].embed, std::vector<int>{2});
  EXPECT_EQ(p[2].embed_grad, std::vector<int>{-1});
  EXPECT_EQ(p[3].embed, std::vector<int>{4});
  EXPECT_EQ(p[4].embed, std::vector<int>{5});
  EXPECT_EQ(p[4].embed_grad, std::vector<int>{1});
  for (size_t k = 0; k < p.size(); ++k) {
    EXPECT_EQ(p[k].update && p[k].aside, k == 3) << "V" << int(k) - 1;
    EXPECT_EQ(p[k].update && !p[k].aside, false) << "V" << int(k) - 1;
    EXPECT_EQ(p[k].take, k == 4) << "V" << int(k) - 1;
  }
  // The stream's first step looks its own first micro-batch up and updates nothing (no
  // gradient is pending yet); a flush ends with V4 and leaves nothing to the next step.
  EXPECT_EQ(text(stream_steps(s, 0, 0, false)).substr(0, 9), "V-1 F0 V0");
  EXPECT_EQ(text(stream_steps(s, 0, 0, false)).substr(text(stream_steps(s, 0, 0, false)).size() - 9), "B1 F4 V3 ");
  EXPECT_EQ(stream_passes(s, 0, false)[3].embed, (std::vector<int>{4}));
  EXPECT_EQ(stream_passes(s, 0, false)[4].embed, (std::vector<int>{5}));
  for (const VocabPass& q : stream_passes(s, 0, false)) EXPECT_FALSE(q.update || q.take);
  EXPECT_EQ(text(stream_steps(s, 0, 1, true)), "B-2 F1 V0 B-1 F2 V1 B0 F3 V2 B1 V3 B2 B3 V4 ");
  EXPECT_EQ(stream_passes(s, 1, true)[5].embed_grad, (std::vector<int>{2, 3}));  // a flush carries B2's, B3's
  EXPECT_TRUE(stream_passes(s, 1, true)[4].embed.empty() && !stream_passes(s, 1, true)[4].update);
  EXPECT_EQ(vocab_buffers(s, 0), 2);
}

// Note [Vocabulary passes ahead]: on two stages of three blocks (F 12, B 15, W 9) and passes worth
// five blocks' forward (config B's head over two ranks), 1F1B's first stage runs one forward
// further ahead and the step ends sooner than with the plain lag and placement, holding one
// micro-batch more; 2bw takes the same rule, so its stream sums as its 1F1B reference does.
TEST(VocabPasses, OneFOneBRunsAheadOfThePassesWhereThatEndsSooner) {
  const StageWork work = {{12, 15, 9}, {12, 15, 9}};
  const double pass = 60;
  const Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 8, 1, true, work, pass);
  Schedule plain = make_lagged(ScheduleKind::k1F1B, 2, 8, LagRule::kPlain);
  add_vocab_passes(plain);
  EXPECT_EQ(pipeline_lag(s, 0), 2);
  EXPECT_EQ(pipeline_lag(s, 1), 0);
  EXPECT_LT(replay_time(s, work, pass), 0.95 * replay_time(plain, work, pass));
  EXPECT_EQ(validate(s).peak_in_flight, (std::vector<int>{3, 1}));
  EXPECT_EQ(validate(plain).peak_in_flight, (std::vector<int>{2, 1}));
  const Schedule stream = make_schedule(ScheduleKind::k2BW, 2, 8, 1, true, work, pass);
  EXPECT_EQ(stream.lag, s.lag);
  EXPECT_EQ(pipeline_lag(stream, 0), 2);
  // Without the passes nothing changes.
  EXPECT_EQ(make_schedule(ScheduleKind::k1F1B, 2, 8, 1, false, work, pass).lag, LagRule::kPlain);
}

// Note [ZB-V with its passes]: the list scheduler that places zb-v's passes on the stages' work
// finishes at pp 2 - 4 and m 1 - 9, on equal and unequal stages and passes short and long
// beside a block: every rank runs V(-1) .. V(m) in order and each stage's F, B and W of every
// micro-batch once, holds at most 2 pp chunk activations (the plain list's cap), and the
// embedding rides once each way; make_schedule keeps a list that finishes.
TEST(VocabPasses, ZeroBubbleVPlacesItsPassesOnTheWork) {
  for (int pp = 2; pp <= 4; ++pp)
    for (double pass : {0.5, 6.0, 60.0})
      for (bool equal : {true, false}) {
        StageWork work(size_t(2 * pp), {12, 15, 9});
        if (!equal) work[0] = {24, 30, 18}, work[size_t(2 * pp - 1)] = {4, 5, 3};
        for (int m = 1; m <= 9; ++m) {
          const std::string what = "pp " + std::to_string(pp) + " pass " + std::to_string(pass) + " m " +
                                   std::to_string(m) + (equal ? " equal" : " unequal");
          const Schedule s = zero_bubble_v_with_passes(pp, m, work, pass);
          ASSERT_EQ(s.steps.size(), size_t(pp)) << what;
          const ScheduleCheck c = validate(s);
          ASSERT_TRUE(c.ok) << what << ": " << c.problem;
          for (int r = 0; r < pp; ++r) {
            EXPECT_LE(c.peak_in_flight[size_t(r)], 2 * pp) << what;
            int next_pass = -1;
            std::vector<int> runs(size_t(3 * 2 * m), 0);  // [phase][chunk][micro]
            for (const PipeStep& st : s.steps[size_t(r)])
              if (st.phase == Phase::kV) EXPECT_EQ(st.micro_batch, next_pass++) << what << " rank " << r;
              else ++runs[size_t((int(st.phase) * 2 + st.chunk) * m + st.micro_batch)];
            EXPECT_EQ(next_pass, m + 1) << what;
            EXPECT_EQ(runs, std::vector<int>(size_t(3 * 2 * m), 1)) << what << " rank " << r;
          }
          expect_each_embedding_once(s, m, what);
          EXPECT_TRUE(validate(make_schedule(ScheduleKind::kZbV, pp, m, 2, true, work, pass)).ok) << what;
        }
      }
  // Backfilling while a pass is due: at pp 3 on the unequal stages, m 16, the step ends at 1,499
  // units (1,536 with the ranks waiting for the pass).
  StageWork work(6, {12, 15, 9});
  work[0] = {24, 30, 18}, work[5] = {4, 5, 3};
  EXPECT_EQ(replay_time(zero_bubble_v_with_passes(3, 16, work, 6), work, 6), 1499);
}

// A pass that one rank skips is a deadlock the validator names; pipedream, pipemare and pp 1
// are refused with the passes.
TEST(VocabPasses, AMissingPassDeadlocksAndTheStreamsAreRefused) {
  Schedule s = make_schedule(ScheduleKind::k1F1B, 3, 4, 1, true);
  auto& list = s.steps[1];
  list.erase(std::find_if(list.begin(), list.end(), [](const PipeStep& st) {
    return st.phase == Phase::kV && st.micro_batch == 0;
  }));  // rank 1's V0
  const ScheduleCheck c = validate(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("deadlock"), std::string::npos) << c.problem;
  for (ScheduleKind k : {ScheduleKind::kPipeDream, ScheduleKind::kPipeMare})
    EXPECT_THROW(make_schedule(k, 2, 1, 1, true), Error) << schedule_name(k);
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 1, 4, 1, true), Error);
}

}  // namespace
}  // namespace loom::parallel
