// Gradient compressors (Note [Gradient compressors]) on thread ranks: the exact cases the
// math gives (top-k with k = n, PowerSGD on rank-1 gradients), the error-feedback
// invariant to the bit, identical bits on every rank, and TernGrad's unbiasedness.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>
#include <random>

#include "loom/comm/world.h"
#include "loom/parallel/accordion.h"
#include "loom/parallel/compress.h"

namespace loom::parallel {
namespace {

comm::CommOptions options() {
  comm::CommOptions o;
  o.timeout = std::chrono::milliseconds(20'000);
  return o;
}

std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// One bucket of the given tensor shapes, tensors back to back.
struct Layout {
  std::vector<ParamSpec> specs;
  Bucket bucket;
};
Layout layout_of(const std::vector<std::vector<int64_t>>& shapes) {
  Layout l;
  int64_t at = 0;
  for (const auto& s : shapes) {
    ParamSpec p;
    p.shape = s;
    p.numel = 1;
    for (int64_t d : s) p.numel *= d;
    p.offset = at;
    at += p.numel;
    l.specs.push_back(p);
  }
  l.bucket = {0, at, 0, int(shapes.size()) - 1};
  return l;
}

CompressSpec spec_of(CompressKind kind) {
  CompressSpec s;
  s.kind = kind;
  s.seed = 7;
  return s;
}

// Runs `steps` reductions of per-rank inputs input(rank, step) on n thread ranks; returns
// every rank's outputs per step and (via state_after) each rank's state after each step.
struct Rounds {
  std::vector<std::vector<std::vector<float>>> out;  // [step][rank]
  std::vector<std::vector<std::vector<float>>> state0;  // [step][rank]: first state buffer after the step
};
Rounds run_ranks(int n, const CompressSpec& spec, const Layout& l, int steps,
              const std::function<std::vector<float>(int, int)>& input) {
  Rounds run;
  run.out.assign(size_t(steps), std::vector<std::vector<float>>(size_t(n)));
  run.state0 = run.out;
  const auto errors = comm::run_threads(n, options(), [&](comm::World& w) {
    const int r = w.global_rank();
    auto c = make_compressor(spec, l.bucket, l.specs, n);
    for (int s = 0; s < steps; s++) {
      std::vector<float> g = input(r, s);
      c->reduce(w.world_group(), std::span<float>(g), s);
      run.out[size_t(s)][size_t(r)] = g;
      if (!c->state().empty()) run.state0[size_t(s)][size_t(r)] = *c->state()[0].data;
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  return run;
}

void expect_same_bits_on_every_rank(const Rounds& run) {
  for (size_t s = 0; s < run.out.size(); s++)
    for (size_t r = 1; r < run.out[s].size(); r++)
      ASSERT_EQ(0, std::memcmp(run.out[s][0].data(), run.out[s][r].data(), run.out[s][0].size() * 4))
          << "step " << s << " rank " << r;
}

TEST(TopK, AllEntriesEqualsTheExactMean) {
  for (int n : {2, 3, 5}) {
    const Layout l = layout_of({{1000}, {37, 3}});
    CompressSpec spec = spec_of(CompressKind::kTopK);
    spec.ratio = 1.0;
    const Rounds run = run_ranks(n, spec, l, 2, [&](int r, int s) { return random_vector(1111, 100 * r + s); });
    expect_same_bits_on_every_rank(run);
    for (int s = 0; s < 2; s++)
      for (size_t i = 0; i < 1111; i++) {
        double mean = 0;
        for (int r = 0; r < n; r++) mean += random_vector(1111, 100 * r + s)[i];
        mean /= n;
        EXPECT_NEAR(run.out[size_t(s)][0][i], mean, 1e-6 * (1 + std::fabs(mean))) << n << " " << i;
      }
  }
}

// sent + new residual == input + old residual, bit for bit, with sent = x - new v (one of
// the two is zero); the result is the rank-order sum of everyone's sent entries / dp.
TEST(TopK, ErrorFeedbackInvariantHoldsToTheBitAndSendsTheLargest) {
  const int n = 3, steps = 4;
  const Layout l = layout_of({{4099}});
  CompressSpec spec = spec_of(CompressKind::kTopK);
  spec.ratio = 0.01;  // k = 41
  auto input = [](int r, int s) { return random_vector(4099, 17 * r + s); };
  const Rounds run = run_ranks(n, spec, l, steps, input);
  expect_same_bits_on_every_rank(run);
  std::vector<std::vector<float>> v(n, std::vector<float>(4099, 0.0f));
  for (int s = 0; s < steps; s++) {
    std::vector<float> expect(4099, 0.0f);
    for (int r = 0; r < n; r++) {
      const std::vector<float> g = input(r, s), &nv = run.state0[size_t(s)][size_t(r)];
      int sent = 0;
      float smallest_sent = INFINITY, largest_kept = 0;
      for (size_t i = 0; i < g.size(); i++) {
        const float x = v[size_t(r)][i] + g[i];
        ASSERT_TRUE(nv[i] == 0.0f || nv[i] == x) << i;
        const float out = x - nv[i];
        ASSERT_EQ(out + nv[i], x);
        if (nv[i] == 0.0f && x != 0.0f) sent++, smallest_sent = std::min(smallest_sent, std::fabs(x));
        else largest_kept = std::max(largest_kept, std::fabs(x));
        expect[i] += out;
      }
      EXPECT_EQ(sent, 41) << "rank " << r << " step " << s;
      EXPECT_GE(smallest_sent, largest_kept);
      v[size_t(r)] = nv;
    }
    for (float& e : expect) e *= 1.0f / float(n);
    ASSERT_EQ(0, std::memcmp(expect.data(), run.out[size_t(s)][0].data(), expect.size() * 4)) << "step " << s;
  }
}

// Note [Top-k by a sampled threshold]: on buckets above the sample size the selection is the
// full sort's - the k largest |x|, ties at the threshold taken by lower index - both where
// ties abound (magnitudes from 0..40) and where the strided sample sees only large entries
// (every 6th entry, the sample's stride here, is large: the first threshold keeps fewer
// than k and must be lowered).
TEST(TopK, SampledThresholdSelectsExactlyTheFullSortsEntries) {
  const int64_t n = 100003;  // stride n / 16384 = 6
  const Layout l = layout_of({{n}});
  CompressSpec spec = spec_of(CompressKind::kTopK);
  spec.ratio = 0.01;  // k = 1001
  const int64_t k = 1001;
  std::mt19937_64 rng(5);
  std::vector<float> ties(static_cast<size_t>(n)), strided(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    ties[size_t(i)] = float(int(rng() % 41)) * (rng() % 2 ? 1.0f : -1.0f);
    strided[size_t(i)] = i % 6 == 0 ? 1000.0f + float(rng() % 100000) : float(rng() % 1000) / 1000.0f;
  }
  for (const std::vector<float>* x : {&ties, &strided}) {
    const Rounds run = run_ranks(1, spec, l, 1, [&](int, int) { return *x; });
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) order[size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return std::fabs((*x)[size_t(a)]) > std::fabs((*x)[size_t(b)]); });
    std::vector<char> expect(static_cast<size_t>(n), 0);
    for (int64_t j = 0; j < k; j++) expect[size_t(order[size_t(j)])] = 1;
    const std::vector<float>& out = run.out[0][0];
    int64_t sent = 0;
    for (int64_t i = 0; i < n; i++) {
      const bool was_sent = out[size_t(i)] != 0.0f || (expect[size_t(i)] && (*x)[size_t(i)] == 0.0f);
      ASSERT_EQ(was_sent, bool(expect[size_t(i)])) << (x == &ties ? "ties" : "strided") << " entry " << i;
      sent += was_sent;
      if (was_sent) ASSERT_EQ(out[size_t(i)], (*x)[size_t(i)]);
    }
    EXPECT_EQ(sent, k);
  }
}

// DGC's momentum correction on one rank: u = m u + g, v = v + u, sent entries masked in both.
TEST(TopK, MomentumCorrectionFollowsDgc) {
  const Layout l = layout_of({{64}});
  CompressSpec spec = spec_of(CompressKind::kTopK);
  spec.ratio = 0.1, spec.momentum = 0.9;
  std::vector<float> u(64, 0.0f), v(64, 0.0f);
  auto input = [](int, int s) { return random_vector(64, 5 + s); };
  const Rounds run = run_ranks(1, spec, l, 3, input);
  for (int s = 0; s < 3; s++) {
    const std::vector<float> g = input(0, s);
    for (size_t i = 0; i < 64; i++) u[i] = 0.9f * u[i] + g[i], v[i] += u[i];
    const std::vector<float>& out = run.out[size_t(s)][0];
    for (size_t i = 0; i < 64; i++) {
      if (out[i] != 0.0f) {
        EXPECT_EQ(out[i], v[i]);
        u[i] = v[i] = 0.0f;
      }
    }
    EXPECT_EQ(run.state0[size_t(s)][0], v) << "step " << s;
  }
}

// E[result] = mean of the (clipped) inputs: over many steps the average of the ternary
// results approaches the exact mean within a few standard errors of s / sqrt(steps). At
// dp 2 the codes are all-gathered, at dp 9 summed as int8 (terngrad_gathers).
TEST(TernGrad, UnbiasedWithASharedScaleAndTernaryValues) {
  for (auto [n, steps] : {std::pair{2, 400}, std::pair{9, 100}}) {
    ASSERT_EQ(terngrad_gathers(n), n == 2);
    const Layout l = layout_of({{50}});
    // Small spread so the +-2.5 sigma clip leaves the values alone.
    auto input = [](int r, int) {
      std::vector<float> x(50);
      for (size_t i = 0; i < 50; i++) x[i] = 0.01f * float(int(i) - 25 + r % 2);
      return x;
    };
    const Rounds run = run_ranks(n, spec_of(CompressKind::kTernGrad), l, steps, input);
    expect_same_bits_on_every_rank(run);
    const float s = 0.01f * 25;  // max |x| over the ranks
    std::vector<double> avg(50, 0.0);
    for (int t = 0; t < steps; t++)
      for (size_t i = 0; i < 50; i++) {
        const float y = run.out[size_t(t)][0][i];
        const double units = double(y) / (s / float(n));
        ASSERT_NEAR(units, std::round(units), 1e-4) << "not a multiple of s / dp: " << y;
        ASSERT_LE(std::fabs(units), n + 1e-4);
        avg[i] += y / steps;
      }
    for (size_t i = 0; i < 50; i++) {
      double mean = 0;
      for (int r = 0; r < n; r++) mean += input(r, 0)[i] / n;
      EXPECT_NEAR(avg[i], mean, 4.0 * s / std::sqrt(double(steps))) << "dp " << n << " " << i;
    }
  }
}

// A NaN on one rank reaches every rank (the optimizer then skips or stops the step), at any
// position of that rank in the max's order.
TEST(TernGrad, ANonFiniteGradientOnAnyRankReachesEveryRank) {
  for (int bad = 0; bad < 3; bad++) {
    const Layout l = layout_of({{40}});
    const Rounds run = run_ranks(3, spec_of(CompressKind::kTernGrad), l, 1, [&](int r, int) {
      std::vector<float> x = random_vector(40, 5 + r);
      if (r == bad) x[7] = NAN;
      return x;
    });
    for (int r = 0; r < 3; r++)
      EXPECT_TRUE(std::isnan(run.out[0][size_t(r)][0])) << "bad rank " << bad << ", rank " << r;
  }
}

// Rank-1 gradients with a common left factor: M_r = a b_r^T. P Q^T reproduces their mean
// exactly (up to rounding), so the residual stays ~0; the vector goes through exact.
TEST(PowerSgd, RankOneGradientsGiveTheExactMean) {
  const int n = 3;
  const Layout l = layout_of({{64, 48}, {48}});
  auto input = [](int r, int s) {
    const std::vector<float> a = random_vector(64, 1), b = random_vector(48, 10 + 7 * r + s), bias = random_vector(48, 99 + r);
    std::vector<float> x(64 * 48 + 48);
    for (size_t i = 0; i < 64; i++)
      for (size_t j = 0; j < 48; j++) x[i * 48 + j] = a[i] * b[j];
    std::copy(bias.begin(), bias.end(), x.begin() + 64 * 48);
    return x;
  };
  const Rounds run = run_ranks(n, spec_of(CompressKind::kPowerSgd), l, 3, input);
  expect_same_bits_on_every_rank(run);
  for (int s = 0; s < 3; s++) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < run.out[0][0].size(); i++) {
      double mean = 0;
      for (int r = 0; r < n; r++) mean += input(r, s)[i];
      mean /= n;
      worst = std::max(worst, std::fabs(run.out[size_t(s)][0][i] - mean));
      scale = std::max(scale, std::fabs(mean));
      if (i >= 64 * 48) EXPECT_NEAR(run.out[size_t(s)][0][i], mean, 1e-6 * (1 + std::fabs(mean)));  // exact path
    }
    EXPECT_LT(worst, 1e-5 * scale) << "step " << s;
  }
}

// Full-rank gradients: the result is a rank-r approximation and M = G' + E holds (to
// rounding) on every rank; the residual feeds the next step.
TEST(PowerSgd, ErrorFeedbackKeepsWhatWasNotSent) {
  const int n = 2;
  const Layout l = layout_of({{40, 30}});
  CompressSpec spec = spec_of(CompressKind::kPowerSgd);
  spec.rank = 2;
  auto input = [](int r, int s) { return random_vector(1200, 31 * r + s); };
  const Rounds run = run_ranks(n, spec, l, 3, input);
  expect_same_bits_on_every_rank(run);
  for (int r = 0; r < n; r++) {
    std::vector<float> e(1200, 0.0f);
    for (int s = 0; s < 3; s++) {
      const std::vector<float> g = input(r, s), &out = run.out[size_t(s)][0], &ne = run.state0[size_t(s)][size_t(r)];
      double worst = 0, sent = 0, kept = 0;
      for (size_t i = 0; i < 1200; i++) {
        const float M = g[i] + e[i];
        worst = std::max(worst, double(std::fabs(out[i] + ne[i] - M)));
        sent += double(out[i]) * out[i], kept += double(ne[i]) * ne[i];
      }
      EXPECT_LT(worst, 1e-5) << "rank " << r << " step " << s;
      EXPECT_GT(sent, 0);
      EXPECT_GT(kept, sent) << "a rank-2 sketch of 40 x 30 noise leaves most of it behind";
      e = ne;
    }
  }
}

// Note [Accordion]: the first window is light; an unchanged window norm (change < eta) turns
// the bucket heavy, a change >= eta turns it light again; the wire bytes follow.
TEST(Accordion, SwitchesOnTheWindowNormsRelativeChange) {
  const Layout l = layout_of({{1000}});
  CompressSpec spec = spec_of(CompressKind::kTopK);
  spec.ratio = 0.1, spec.heavy_ratio = 0.01, spec.accordion = true, spec.window = 2, spec.eta = 0.5;
  auto c = make_compressor(spec, l.bucket, l.specs, 2);
  Accordion acc(spec, {l.bucket});
  const double light = c->wire_bytes();
  std::vector<float> g(1000, 1.0f);
  auto window = [&](float scale, int64_t step) {
    std::fill(g.begin(), g.end(), scale);
    acc.observe(0, g, step, *c);
    acc.observe(0, g, step + 1, *c);
  };
  window(1.0f, 0);  // first window: critical by definition
  EXPECT_FALSE(c->heavy());
  EXPECT_TRUE(acc.take_log().empty());
  window(1.2f, 2);  // change 0.2 < 0.5: heavy
  EXPECT_TRUE(c->heavy());
  EXPECT_NEAR(c->wire_bytes(), light / 10, 1e-9);
  std::vector<std::string> log = acc.take_log();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("bucket 0 -> heavy (ratio 0.01"), std::string::npos) << log[0];
  EXPECT_NE(log[0].find("after step 4"), std::string::npos) << log[0];
  window(1.0f, 4);  // change 1/6: stays heavy, nothing logged
  EXPECT_TRUE(c->heavy());
  EXPECT_TRUE(acc.take_log().empty());
  window(3.0f, 6);  // change 2 >= 0.5: light again
  EXPECT_FALSE(c->heavy());
  EXPECT_EQ(acc.take_log().size(), 1u);
  EXPECT_EQ(*acc.state(0)[1].data, (std::vector<float>{float(std::sqrt(1000.0) * 6), 0.0f, 0.0f}));
}

TEST(CompressSpec, WireBytesShrinkAsThePapersSay) {
  const Layout l = layout_of({{768, 768}, {768}});
  const int64_t n = l.bucket.count;
  const double exact = 2.0 * 0.5 * 4.0 * double(n);  // ring all-reduce at dp 2
  CompressSpec topk = spec_of(CompressKind::kTopK);
  topk.ratio = 0.01;
  EXPECT_NEAR(make_compressor(topk, l.bucket, l.specs, 2)->wire_bytes(), 8.0 * std::ceil(0.01 * double(n)), 1e-9);
  EXPECT_NEAR(make_compressor(spec_of(CompressKind::kTernGrad), l.bucket, l.specs, 2)->wire_bytes(),
              double((n + 3) / 4) + 4.0, 1e-9);
  const double psgd = make_compressor(spec_of(CompressKind::kPowerSgd), l.bucket, l.specs, 2)->wire_bytes();
  EXPECT_NEAR(psgd, 4.0 * double(768 * 4 * 2 + 768), 1e-9);
  EXPECT_GT(exact / psgd, 20.0);
  // 1-bit Adam: per tensor, a chunk's signs and one scale in the all-to-all and again in the
  // all-gather.
  const double onebit = make_compressor(spec_of(CompressKind::kOneBitAdam), l.bucket, l.specs, 2)->wire_bytes();
  EXPECT_NEAR(onebit, 2.0 * (768 * 768 / 2 / 8 + 4 + 768 / 2 / 8 + 4), 1e-9);
  EXPECT_GT(exact / onebit, 30.0);
}

// Two tensors with 12 floats of alignment padding between them (the gap is never sent or
// written); the value 7 marks it.
Layout padded_pair() {
  Layout l = layout_of({{37, 5}, {100}});
  l.specs[1].offset = 197;
  l.bucket.count = 297;
  return l;
}

// Note [1-bit Adam]: inputs of one magnitude per tensor, the same on every rank, pass
// bit for bit (rms(+-c) = c for c a power of two, so no residual is left at either hop).
TEST(OneBit, OneMagnitudePerTensorPassesExactly) {
  for (int n : {2, 4}) {
    const Layout l = padded_pair();
    auto input = [&](int, int s) {
      std::vector<float> x(297, 7.0f);
      for (int i = 0; i < 185; i++) x[size_t(i)] = (i * 7 + s) % 3 ? 0.25f : -0.25f;
      for (int i = 197; i < 297; i++) x[size_t(i)] = (i + s) % 2 ? 0.0625f : -0.0625f;
      return x;
    };
    const Rounds run = run_ranks(n, spec_of(CompressKind::kOneBitAdam), l, 3, input);
    expect_same_bits_on_every_rank(run);
    for (int s = 0; s < 3; s++) {
      EXPECT_EQ(run.out[size_t(s)][0], input(0, s)) << n << " ranks, step " << s;
      EXPECT_EQ(run.state0[size_t(s)][0], std::vector<float>(297, 0.0f));
    }
  }
}

// Worker error feedback: sent + new residual = input + old residual, where the sent chunk
// is rms(y) sign(y) of y = input + old residual (up to the one rounding of y - sent); the
// padding's residual stays 0; every rank ends with the same bits.
TEST(OneBit, WorkerErrorFeedbackSendsTheScaledSigns) {
  const int n = 3, steps = 3;
  const Layout l = padded_pair();
  auto input = [](int r, int s) {
    std::vector<float> x = random_vector(297, 31 * r + s);
    std::fill(x.begin() + 185, x.begin() + 197, 0.0f);
    return x;
  };
  const Rounds run = run_ranks(n, spec_of(CompressKind::kOneBitAdam), l, steps, input);
  expect_same_bits_on_every_rank(run);
  // Tensor chunks: (offset, length) of chunk j is (at + j L, ...), L = ceil(numel / 3).
  const std::vector<std::pair<int64_t, int64_t>> tensors = {{0, 185}, {197, 100}};
  for (int r = 0; r < n; r++) {
    std::vector<float> e(297, 0.0f);
    for (int s = 0; s < steps; s++) {
      const std::vector<float> x = input(r, s), &ne = run.state0[size_t(s)][size_t(r)];
      for (const auto& [at, numel] : tensors) {
        const int64_t L = (numel + 2) / 3;
        for (int64_t lo = at; lo < at + numel; lo += L) {
          const int64_t hi = std::min(at + numel, lo + L);
          double ss = 0;
          for (int64_t i = lo; i < hi; i++) ss += double(x[size_t(i)] + e[size_t(i)]) * (x[size_t(i)] + e[size_t(i)]);
          const double scale = std::sqrt(ss / double(hi - lo));
          for (int64_t i = lo; i < hi; i++) {
            const float y = x[size_t(i)] + e[size_t(i)];
            const double sent = double(y) - double(ne[size_t(i)]);
            ASSERT_NEAR(sent, y >= 0 ? scale : -scale, 1e-6 * scale) << "rank " << r << " step " << s << " at " << i;
          }
        }
      }
      for (int64_t i = 185; i < 197; i++) ASSERT_EQ(ne[size_t(i)], 0.0f);
      e = ne;
    }
  }
}

}  // namespace
}  // namespace loom::parallel

namespace loom::parallel {
namespace {

// Note [0/1 Adam]: the schedule's pure functions against DeepSpeed's counters run step by
// step (var_interval doubling after var_scaler updates, local_step_interval after
// local_scaler local steps, clipped), for several settings and 400 steps.
TEST(ZeroOneAdam, ScheduleFollowsDeepSpeedsCounters) {
  for (const auto& [kappa, freeze, scaler, clip] : std::vector<std::array<int64_t, 4>>{
           {16, 100, 32678, 16}, {2, 50, 3, 4}, {1, 200, 1, 16}, {3, 0, 5, 2}}) {
    CompressSpec s;
    s.kind = CompressKind::kZeroOneAdam;
    s.var_freeze = freeze, s.var_scaler = kappa, s.local_scaler = scaler, s.local_clip = clip;
    int64_t var_interval = 1, var_counter = 0, local_interval = 1, local_counter = 0, updates = 0;
    for (int64_t t = 1; t <= 400; t++) {
      const std::string at = "kappa " + std::to_string(kappa) + " t " + std::to_string(t);
      if (t <= freeze) {
        const bool var = t % var_interval == 0;
        updates += var;
        ASSERT_EQ(s.variance_step(t - 1), var) << at;
        ASSERT_EQ(s.sync_at(t - 1), var ? StepSync::kExact : StepSync::kLocal) << at;
        if (var && ++var_counter == kappa) var_counter = 0, var_interval *= 2;
      } else {
        ASSERT_EQ(s.sync_at(t - 1), StepSync::kLocal) << at;
        ASSERT_FALSE(s.variance_step(t - 1)) << at;
        ASSERT_EQ(s.local_sync(t - 1), t % local_interval == 0) << at;
        if (++local_counter == scaler) local_counter = 0, local_interval = std::min(clip, local_interval * 2);
      }
      ASSERT_EQ(s.variance_updates(t - 1), updates) << at;
    }
  }
  // Checkpoints, validation and the last step always synchronise.
  CompressSpec s;
  s.kind = CompressKind::kZeroOneAdam;
  s.var_freeze = 0, s.local_scaler = 1, s.local_clip = 64, s.train_steps = 100, s.save_every = 30, s.val_every = 25;
  EXPECT_FALSE(s.local_sync(40));  // t = 41 at interval 64
  for (int64_t t : {25, 30, 50, 60, 75, 90, 100}) EXPECT_TRUE(s.local_sync(t - 1)) << t;
}

}  // namespace
}  // namespace loom::parallel
