// Note [Vocabulary passes]: every flushing schedule with the passes inserted finishes, keeps
// its memory, runs the passes in one order on every rank, and carries each micro-batch's
// embedding lookup and gradient once; 2bw's steps likewise (Note [Vocabulary passes in a
// stream]).
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

TEST(VocabPasses, EveryFlushingScheduleFinishesWithTheSameMemory) {
  const Kind kinds[] = {{ScheduleKind::kGPipe, 1},  {ScheduleKind::k1F1B, 1}, {ScheduleKind::kInterleaved1F1B, 2},
                        {ScheduleKind::kZbH1, 1},   {ScheduleKind::kZbH2, 1}, {ScheduleKind::kZbV, 2}};
  for (const Kind& k : kinds)
    for (int pp = 2; pp <= 4; ++pp)
      for (int m = 1; m <= 9; ++m) {
        if (k.kind == ScheduleKind::kInterleaved1F1B && m % pp != 0) continue;
        const std::string what = std::string(schedule_name(k.kind)) + " pp " + std::to_string(pp) + " m " +
                                 std::to_string(m);
        const Schedule plain = make_schedule(k.kind, pp, m, k.vpp);
        const Schedule s = make_schedule(k.kind, pp, m, k.vpp, true);
        const ScheduleCheck a = validate(plain), b = validate(s);
        ASSERT_TRUE(b.ok) << what << ": " << b.problem;
        EXPECT_EQ(b.peak_in_flight, a.peak_in_flight) << what;
        EXPECT_EQ(b.peak_pending_w, a.peak_pending_w) << what;
        ASSERT_EQ(s.passes.size(), size_t(m + 2)) << what;
        std::vector<int> embeds(size_t(m), 0), grads(size_t(m), 0);
        for (const VocabPass& v : s.passes) {
          for (int j : v.embed) ++embeds[size_t(j)];
          for (int j : v.embed_grad) ++grads[size_t(j)];
        }
        EXPECT_EQ(embeds, std::vector<int>(size_t(m), 1)) << what;
        EXPECT_EQ(grads, std::vector<int>(size_t(m), 1)) << what;
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

// 1F1B at pp 2, m 4. The plain replay's ticks: rank 1 (the head's stage) runs F(i) at 2i + 1,
// so rank 0 runs V(i) after its steps of ticks <= 2i + 1: F0@0 F1@1 | B0@3 | F2@4 B1@5 | ...
// Lookups ride in the last pass before the first stage's F, gradients in the first after its B.
TEST(VocabPasses, OneFOneBCarriesTheEmbeddingInThePassesAroundTheFirstStage) {
  const Schedule s = make_schedule(ScheduleKind::k1F1B, 2, 4, 1, true);
  EXPECT_EQ(text(s.steps[0]), "V-1 F0 F1 V0 B0 V1 F2 B1 V2 F3 B2 V3 B3 V4 ");
  EXPECT_EQ(text(s.steps[1]), "V-1 F0 V0 B0 F1 V1 B1 F2 V2 B2 F3 V3 B3 V4 ");
  const std::vector<std::vector<int>> embed = {{0, 1}, {}, {2}, {3}, {}, {}}, grad = {{}, {}, {0}, {1}, {2}, {3}};
  for (size_t k = 0; k < s.passes.size(); ++k) {
    EXPECT_EQ(s.passes[k].head, k >= 1 && k <= 4 ? int(k) - 1 : -1) << k;
    EXPECT_EQ(s.passes[k].embed, embed[k]) << k;
    EXPECT_EQ(s.passes[k].embed_grad, grad[k]) << k;
  }
}

// The buffers the first stage holds for the embedding (vocab_buffers): 1F1B at pp 2, m 4 holds
// the two lookups of V(-1) before F0 (then at most one gradient or lookup: V(i) carries
// B(i-1)'s gradient away before it looks F(i+1)'s up); GPipe holds the four gradients of its
// backwards until V(4). Every other rank one, for the lookup it sums onto the first stage.
TEST(VocabPasses, TheFirstStageHoldsItsLookupsAndGradientsInFlight) {
  const Schedule one = make_schedule(ScheduleKind::k1F1B, 2, 4, 1, true);
  EXPECT_EQ(vocab_buffers(one, 0), 2);
  EXPECT_EQ(vocab_buffers(one, 1), 1);
  const Schedule gpipe = make_schedule(ScheduleKind::kGPipe, 2, 4, 1, true);
  EXPECT_EQ(vocab_buffers(gpipe, 0), 4);
  EXPECT_EQ(vocab_buffers(gpipe, 1), 1);
}

// Note [Vocabulary passes in a stream]: every kind of 2bw step (age 0 or older, flushing or
// not) runs its plain steps in their order with V(-1) .. V(m) among them, looks each of its
// micro-batches up once and carries each embedding gradient of a backward it runs once (a
// trailing backward's, of the step before, too); the stream of them finishes.
TEST(VocabPasses, EveryKindOfTwoBwStepCarriesItsOwnEmbedding) {
  for (int pp = 2; pp <= 4; ++pp)
    for (int m = pp; m <= 8; ++m) {
      const std::string what = "pp " + std::to_string(pp) + " m " + std::to_string(m);
      const Schedule plain = make_schedule(ScheduleKind::k2BW, pp, m);
      const Schedule s = make_schedule(ScheduleKind::k2BW, pp, m, 1, true);
      const ScheduleCheck c = validate(s);
      ASSERT_TRUE(c.ok) << what << ": " << c.problem;
      EXPECT_EQ(c.peak_in_flight, validate(plain).peak_in_flight) << what;
      for (int age = 0; age <= 1; ++age)
        for (bool flush : {false, true}) {
          const std::string kind = what + " age " + std::to_string(age) + (flush ? " flush" : "");
          const std::vector<VocabPass>& passes = stream_passes(s, age, flush);
          ASSERT_EQ(passes.size(), size_t(m + 2)) << kind;
          std::vector<int> embeds, grads;
          for (const VocabPass& v : passes) {
            embeds.insert(embeds.end(), v.embed.begin(), v.embed.end());
            grads.insert(grads.end(), v.embed_grad.begin(), v.embed_grad.end());
          }
          std::vector<int> first_b;
          for (int r = 0; r < pp; ++r) {
            std::vector<PipeStep> rest;
            int next_pass = -1;
            for (const PipeStep& st : stream_steps(s, r, age, flush))
              if (st.phase == Phase::kV) EXPECT_EQ(st.micro_batch, next_pass++) << kind << " rank " << r;
              else rest.push_back(st);
            EXPECT_EQ(next_pass, m + 1) << kind;
            const std::vector<PipeStep> want = stream_steps(plain, r, age, flush);
            ASSERT_EQ(rest.size(), want.size()) << kind;
            for (size_t i = 0; i < rest.size(); ++i)
              EXPECT_TRUE(rest[i].phase == want[i].phase && rest[i].micro_batch == want[i].micro_batch) << kind;
            for (const PipeStep& st : want)
              if (r == 0 && st.phase == Phase::kB) first_b.push_back(st.micro_batch);
          }
          std::vector<int> all(static_cast<size_t>(m), 0);
          for (int i = 0; i < m; ++i) all[size_t(i)] = i;
          EXPECT_EQ(embeds, all) << kind;
          EXPECT_EQ(grads, first_b) << kind;
        }
    }
}

// pp 2, m 4, a steady step: the first stage's trailing backward B(-1) (the step before's
// micro-batch 3) runs after F0, so V0 carries its gradient with micro-batch 1's lookup; the
// epilogue carries nothing (B2's gradient left in V3) but ends the step on every rank.
TEST(VocabPasses, ASteadyTwoBwStepCarriesTheStepBeforesLastGradient) {
  const Schedule s = make_schedule(ScheduleKind::k2BW, 2, 4, 1, true);
  EXPECT_EQ(text(stream_steps(s, 0, 1, false)), "V-1 F0 B-1 V0 F1 B0 V1 F2 B1 V2 F3 B2 V3 V4 ");
  EXPECT_EQ(text(stream_steps(s, 1, 1, false)), "V-1 F0 V0 B0 F1 V1 B1 F2 V2 B2 F3 V3 B3 V4 ");
  const std::vector<VocabPass>& p = stream_passes(s, 1, false);
  EXPECT_EQ(p[1].embed_grad, std::vector<int>{-1});
  EXPECT_EQ(p[1].embed, std::vector<int>{1});
  EXPECT_TRUE(p[5].embed_grad.empty() && p[5].embed.empty());
  EXPECT_EQ(stream_passes(s, 1, true)[5].embed_grad, std::vector<int>{3});  // a flush carries B3's
  EXPECT_EQ(vocab_buffers(s, 0), 2);
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
