// Note [bf16 optimizer moments]: AdamW with m and v in bf16, stochastically rounded (Note
// [Stochastic rounding]). The exact reference beside it is fp32 AdamW: from the same state a
// step moves the parameters by the same bits, and each stored moment is one of the two bf16
// neighbours of fp32 AdamW's moment (|error| < one bf16 step, 2^-7 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "loom/core/bf16.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/ref/gemm_bf16.h"
#include "loom/optim/optimizer.h"

namespace loom {
namespace {

// The bf16 values just below and above |x| in magnitude (equal when x is a bf16).
bool is_neighbour(bf16 h, float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const bf16 down = bf16(u >> 16), up = bf16((u >> 16) + ((u & 0xffffu) ? 1u : 0u));
  return h == down || h == up;
}

struct State {
  std::vector<float> p, g;
  std::vector<bf16> m, v;
};

State random_state(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  State s;
  for (int64_t i = 0; i < n; i++) {
    s.p.push_back(nd(rng));
    s.g.push_back(0.1f * nd(rng));
    s.m.push_back(to_bf16(0.05f * nd(rng)));
    s.v.push_back(to_bf16(1e-3f * std::fabs(nd(rng)) + 1e-6f));
  }
  return s;
}

TEST(Bf16Moments, StepIsFp32AdamWsWithEachMomentANeighbourOfItsValue) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const int64_t n = 10007, first = 123456789;
  const State s = random_state(n, seed);
  for (int step : {1, 7}) {
    // Exact reference: fp32 AdamW on the widened moments.
    std::vector<float> p32 = s.p, m32(static_cast<size_t>(n)), v32(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) m32[size_t(i)] = from_bf16(s.m[size_t(i)]), v32[size_t(i)] = from_bf16(s.v[size_t(i)]);
    cpu::adamw_update(p32.data(), s.g.data(), m32.data(), v32.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
    State fast = s, ref = s;
    cpu::adamw_update_bf16_moments(fast.p.data(), s.g.data(), fast.m.data(), fast.v.data(), n, 1e-2f, 0.9f, 0.95f,
                                   1e-8f, 0.1f, step, 0.5f, first);
    ref::adamw_update_bf16_moments(ref.p.data(), s.g.data(), ref.m.data(), ref.v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                                   0.1f, step, 0.5f, first);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) {
      const size_t k = size_t(i);
      ASSERT_EQ(fast.p[k], p32[k]) << i;  // the update reads the unrounded m', v'
      ASSERT_TRUE(is_neighbour(fast.m[k], m32[k])) << i << ": " << from_bf16(fast.m[k]) << " for " << m32[k];
      ASSERT_TRUE(is_neighbour(fast.v[k], v32[k])) << i << ": " << from_bf16(fast.v[k]) << " for " << v32[k];
      // The reference (fp64 arithmetic, the same rounding bits) agrees to fp32 rounding on
      // p, and on the moments up to the rare element whose fp32 and fp64 values straddle a
      // rounding threshold (one bf16 step), plus the fp32 error of m' = b1 m + (1 - b1) g
      // itself, which is relative to its terms, not to m' (they can cancel: a seed gave m' =
      // 2.5e-8 from terms near 0.05, fp32 and fp64 three bf16 steps apart).
      const double terms = 0.9 * std::fabs(from_bf16(s.m[k])) + 0.1 * std::fabs(s.g[k]);
      EXPECT_NEAR(ref.p[k], fast.p[k], 1e-6f * (1 + std::fabs(fast.p[k]))) << i;
      EXPECT_NEAR(from_bf16(ref.m[k]), from_bf16(fast.m[k]), std::ldexp(std::fabs(m32[k]), -7) + std::ldexp(terms, -22))
          << i;
      EXPECT_NEAR(from_bf16(ref.v[k]), from_bf16(fast.v[k]), std::ldexp(std::fabs(v32[k]), -7)) << i;
      differ += ref.m[k] != fast.m[k] || ref.v[k] != fast.v[k];
    }
    EXPECT_LE(differ, n / 1000) << "step " << step;
  }
}

TEST(Bf16Moments, StochasticRoundingIsUnbiasedAndNearestRoundingStagnates) {
  // One value between two bf16 neighbours, rounded with 2^16 indices' bits: the mean is the
  // value within 4 standard errors (the draws are a fixed function of the index).
  const float x = 1.0f + 0.3f * std::ldexp(1.0f, -7);
  double sum = 0;
  const int n = 1 << 16;
  for (int i = 0; i < n; i++) sum += from_bf16(to_bf16_stochastic(x, random_bits(7u, uint64_t(i))));
  const double step = std::ldexp(1.0, -7), se = step * std::sqrt(0.3 * 0.7 / n);
  EXPECT_NEAR(sum / n, double(x), 4 * se);
  EXPECT_EQ(from_bf16(to_bf16_stochastic(-x, 0)), -1.0f);  // r = 0 truncates toward zero
  EXPECT_TRUE(std::isinf(from_bf16(to_bf16_stochastic(INFINITY, 0xffffu))));
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16_stochastic(NAN, 0xffffu))));
  // Why the moments round stochastically: v = b2 v + (1-b2) g^2 with b2 = 0.999 moves v by
  // 0.1% of (g^2 - v) a step, under half a bf16 step, so nearest rounding never moves v off
  // its start. Stochastic rounding is unbiased, and its error e_t = b2 e_{t-1} + r_t (r_t the
  // step's rounding, variance <= u^2 / 4 for the bf16 step u = 2^-7 on [1, 2)) has standard
  // deviation <= sqrt(u^2 / (4 (1 - b2^2))) = 0.087 here: the mean of 512 elements' trajectories
  // follows fp32 within 4 standard errors.
  const float b2 = 0.999f, g2 = 2.0f;
  const int elems = 512;
  float exact = 1.0f;
  bf16 nearest = to_bf16(1.0f);
  std::vector<bf16> sr(elems, to_bf16(1.0f));
  for (int t = 1; t <= 2000; t++) {
    exact = b2 * exact + (1 - b2) * g2;
    nearest = to_bf16(b2 * from_bf16(nearest) + (1 - b2) * g2);
    for (int i = 0; i < elems; i++)
      sr[size_t(i)] = to_bf16_stochastic(b2 * from_bf16(sr[size_t(i)]) + (1 - b2) * g2, random_bits(uint32_t(t), uint64_t(i)));
  }
  EXPECT_EQ(from_bf16(nearest), 1.0f);
  EXPECT_GT(exact, 1.8f);
  double mean = 0;
  for (bf16 h : sr) mean += from_bf16(h) / elems;
  const double sd = std::sqrt(std::ldexp(1.0, -14) / (4 * (1 - double(b2) * b2)));
  EXPECT_NEAR(mean, exact, 4 * sd / std::sqrt(double(elems)));
}

// Note [Vectorized AdamW]: the vector loops keep an element's bits independent of where a
// range cuts the buffer (ZeRO shards, decay runs), in fp32 and with bf16 moments.
TEST(Bf16Moments, AdamWBitsDoNotDependOnWhereARangeStarts) {
  const int64_t n = 100003;
  const State s = random_state(n, 11);
  std::vector<float> m32(static_cast<size_t>(n)), v32(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) m32[size_t(i)] = from_bf16(s.m[size_t(i)]), v32[size_t(i)] = from_bf16(s.v[size_t(i)]);
  State whole = s, cut = s;
  std::vector<float> mw = m32, vw = v32, mc = m32, vc = v32;
  auto fp32 = [&](State& x, std::vector<float>& m, std::vector<float>& v, int64_t a, int64_t b) {
    cpu::adamw_update(x.p.data() + a, s.g.data() + a, m.data() + a, v.data() + a, b - a, 1e-2f, 0.9f, 0.95f, 1e-8f,
                      0.1f, 3, 0.37f);
  };
  auto bf = [&](State& x, int64_t a, int64_t b) {
    cpu::adamw_update_bf16_moments(x.p.data() + a, s.g.data() + a, x.m.data() + a, x.v.data() + a, b - a, 1e-2f, 0.9f,
                                   0.95f, 1e-8f, 0.1f, 3, 0.37f, a);
  };
  fp32(whole, mw, vw, 0, n);
  bf(whole, 0, n);
  const int64_t cuts[] = {0, 13, 77, 5000, 5003, n};
  for (int c = 0; c + 1 < 6; c++) fp32(cut, mc, vc, cuts[c], cuts[c + 1]), bf(cut, cuts[c], cuts[c + 1]);
  EXPECT_EQ(whole.p, cut.p);
  EXPECT_EQ(mw, mc);
  EXPECT_EQ(vw, vc);
  EXPECT_EQ(whole.m, cut.m);
  EXPECT_EQ(whole.v, cut.v);
}

ParamLayout tiny_layout() {
  ModelConfig m;
  apply_model_preset(m, "tiny");
  m.layers = 1;
  return ParamLayout(m);
}

// The rounding bits follow the flat offset: ZeRO shards step exactly as the whole buffer.
TEST(Bf16Moments, ShardsStepAsTheWholeBufferAndCheckpointViewsRoundTrip) {
  const ParamLayout layout = tiny_layout();
  const int64_t n = layout.total_floats();
  OptimConfig o;
  o.moments = FloatFormat::kBf16;
  const Kernels& k = kernels(KernelBackend::kCpu);
  const State s = random_state(n, 5);
  std::vector<float> whole = s.p, sharded = s.p;
  AdamW a(layout, o);
  const std::vector<FlatRange> halves[2] = {{{0, n / 3}, {2 * n / 3, n - 2 * n / 3}}, {{n / 3, 2 * n / 3 - n / 3}}};
  AdamW b0(layout, o, halves[0]), b1(layout, o, halves[1]);
  for (int t = 0; t < 3; t++) {
    a.step(k, whole, s.g, 1e-2);
    b0.step(k, sharded, s.g, 1e-2);
    b1.step(k, sharded, s.g, 1e-2);
  }
  EXPECT_EQ(whole, sharded);
  // A checkpoint's fp32 view of the moments: widened exactly, stored back exactly.
  std::vector<float> m(a.moment(0).begin(), a.moment(0).end());
  a.settle_moments(false);
  EXPECT_GT(std::count_if(m.begin(), m.end(), [](float x) { return x != 0.0f; }), n / 2);
  for (float x : m) ASSERT_EQ(round_bf16(x), x);
  std::span<float> view = a.moment(0);
  std::fill(view.begin(), view.end(), 0.25f);
  a.settle_moments(true);
  for (float x : a.moment(0)) ASSERT_EQ(x, 0.25f);
  a.settle_moments(false);
  const auto [data, bytes] = a.moment_storage(1);
  EXPECT_NE(data, nullptr);
  EXPECT_EQ(bytes, n * 2);
}

std::string error_of(const std::vector<std::string>& sets) {
  try {
    load_config("", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Bf16Moments, RefusedWhereTheMomentsLeaveAdamWsUpdateNamingWhatWorks) {
  EXPECT_NE(error_of({"optim.moments=fp16"}).find("optim.moments = 'fp16': expected fp32 or bf16"), std::string::npos);
  EXPECT_NE(error_of({"optim.moments=bf16", "optim.name=sgd"}).find("use optim.name = adamw"), std::string::npos);
  EXPECT_NE(error_of({"optim.moments=bf16", "parallel.dp=2", "parallel.compress=onebit_adam"})
                .find("bf16 moments work with compress = none"),
            std::string::npos);
  EXPECT_NE(error_of({"optim.moments=bf16", "offload.optimizer=disk", "offload.dir=/tmp"})
                .find("keep bf16 moments in memory (offload.optimizer = none)"),
            std::string::npos);
  EXPECT_NE(error_of({"optim.moments=bf16", "parallel.dp=2", "parallel.ps_servers=1"}).find("use optim.moments = fp32"),
            std::string::npos);
  EXPECT_NE(error_of({"optim.moments=bf16", "train.device=cuda"}).find("the CUDA backend keeps fp32 moments"),
            std::string::npos);
  EXPECT_EQ(error_of({"optim.moments=bf16", "parallel.dp=2", "parallel.zero=1", "parallel.compress=powersgd"}), "");
}

}  // namespace
}  // namespace loom
