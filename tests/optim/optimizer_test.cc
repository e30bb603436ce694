#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "loom/optim/optimizer.h"

namespace loom {
namespace {

TEST(Optimizer, WarmupThenCosine) {
  OptimConfig o;
  o.lr = 1.0, o.warmup_steps = 4, o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 14), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(o, 3, 14), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(o, 4, 14), 1.0);                    // cosine starts at the peak
  EXPECT_NEAR(lr_at(o, 9, 14), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);  // halfway
  EXPECT_NEAR(lr_at(o, 14, 14), 0.1, 1e-12);
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(o, 0, 10), 1.0);
}

TEST(Optimizer, ClipMatchesTorchFormula) {
  const Kernels& k = kernels(KernelBackend::kCpu);
  std::vector<float> g = {3.0f, 4.0f};  // norm 5
  EXPECT_NEAR(clip_grad_norm(k, g, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(g[0], 3.0 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(g[1], 4.0 / (5.0 + 1e-6), 1e-6);
  std::vector<float> h = {0.3f, 0.4f};  // norm 0.5 < 1: untouched
  clip_grad_norm(k, h, 1.0);
  EXPECT_EQ(h[0], 0.3f);
}

TEST(Optimizer, AdamWDecaysMatricesOnlyAndMatchesClosedForm) {
  ModelConfig m;
  apply_model_preset(m, "tiny");
  m.layers = 1;
  ParamLayout layout(m);
  OptimConfig o;
  o.weight_decay = 0.5;
  AdamW opt(layout, o);
  std::vector<float> p(layout.total_floats(), 1.0f), g(layout.total_floats(), 0.0f);
  opt.step(kernels(KernelBackend::kCpu), p, g, 0.1);
  // Zero gradient: the Adam term is 0, so only decoupled decay moves weights: p = 1 - lr*wd.
  const float decayed = 1.0f - 0.1f * 0.5f;
  EXPECT_FLOAT_EQ(p[layout.at("h.0.attn.qkv.w").offset], decayed);
  EXPECT_FLOAT_EQ(p[layout.at("wte").offset], decayed);
  EXPECT_FLOAT_EQ(p[layout.at("h.0.norm1.w").offset], 1.0f);
  EXPECT_FLOAT_EQ(p[layout.at("h.0.attn.qkv.b").offset], 1.0f);
  // With a gradient g, step 1: m/(1-b1) = g, v/(1-b2) = g^2, update = g/(|g| + eps) ~ sign(g).
  std::fill(p.begin(), p.end(), 0.0f);
  std::fill(g.begin(), g.end(), 2.0f);
  AdamW fresh(layout, o);
  fresh.step(kernels(KernelBackend::kCpu), p, g, 0.1);
  EXPECT_NEAR(p[layout.at("h.0.norm1.b").offset], -0.1, 1e-6);
  EXPECT_EQ(fresh.steps_taken(), 1);
}

// Note [SGD with momentum]: three steps against torch.optim.SGD's rule in fp64 (coupled L2 on
// the matrices only, dampening 0); v stays zero and the step count advances.
TEST(Optimizer, SgdWithMomentumFollowsTorchsRule) {
  ModelConfig m;
  apply_model_preset(m, "tiny");
  m.layers = 1;
  const ParamLayout layout(m);
  OptimConfig o;
  o.name = OptimizerKind::kSgd, o.momentum = 0.8, o.weight_decay = 0.25;
  AdamW opt(layout, o);
  const int64_t n = layout.total_floats();
  std::vector<float> p(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  std::vector<double> want_p(static_cast<size_t>(n)), buf(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = float(std::sin(double(i))), want_p[size_t(i)] = p[size_t(i)];
  const int64_t mat = layout.at("h.0.attn.qkv.w").offset, norm = layout.at("h.0.norm1.w").offset;
  for (int step = 0; step < 3; ++step) {
    for (int64_t i = 0; i < n; ++i) g[size_t(i)] = float(std::cos(double(i + 7 * step)));
    const double lr = 0.05 * (step + 1);
    opt.step(kernels(KernelBackend::kCpu), p, g, lr);
    for (int64_t i : {mat, mat + 5, norm, norm + 3}) {
      const double wd = i == mat || i == mat + 5 ? 0.25 : 0.0;  // the norm weights are not decayed
      buf[size_t(i)] = 0.8 * buf[size_t(i)] + (double(g[size_t(i)]) + wd * want_p[size_t(i)]);
      want_p[size_t(i)] -= lr * buf[size_t(i)];
    }
  }
  for (int64_t i : {mat, mat + 5, norm, norm + 3}) EXPECT_NEAR(p[size_t(i)], want_p[size_t(i)], 1e-6) << i;
  EXPECT_EQ(opt.steps_taken(), 3);
  const std::span<float> v = opt.moment(1);
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
}

// Note [1-bit Adam]: with the reduced update u left as momentum_to_update made it, the two
// halves are AdamW's step with v (and 1 - b2^T_w) frozen, against the formula in fp64;
// entries whose v is 0 only decay; m keeps its momentum units.
TEST(Optimizer, OneBitAdamHalvesAreAdamWithTheVarianceFrozen) {
  ModelConfig mc;
  apply_model_preset(mc, "tiny");
  mc.layers = 1;
  ParamLayout layout(mc);
  OptimConfig o;
  AdamW opt(layout, o);
  const size_t n = size_t(layout.total_floats());
  std::vector<float> p(n), g(n);
  for (size_t i = 0; i < n; i++) p[i] = std::sin(0.37 * double(i)), g[i] = 0.01f * float(std::cos(0.11 * double(i)));
  const int64_t warm = 3;
  for (int s = 0; s < warm; s++) opt.step(kernels(KernelBackend::kCpu), p, g, 0.01);
  opt.v()[5] = 0.0f;  // as if entry 5 saw no gradient in the warm-up
  const std::vector<float> m0 = opt.m(), v0 = opt.v(), p0 = p;
  std::vector<float> u = g;
  for (float& x : u) x *= -0.5f;
  opt.momentum_to_update(u, warm);
  opt.step_with_update(p, u, 0.02, warm);
  EXPECT_EQ(opt.v(), v0);
  EXPECT_EQ(opt.steps_taken(), warm + 1);
  const double bc1 = 1 - std::pow(o.beta1, warm + 1.0), bc2 = 1 - std::pow(o.beta2, double(warm));
  for (const ParamSpec& s : layout.specs())
    for (int64_t i = s.offset; i < s.offset + s.numel; i++) {
      const double m = o.beta1 * m0[size_t(i)] + (1 - o.beta1) * (-0.5 * g[size_t(i)]);
      const double v = v0[size_t(i)], wd = s.decay ? o.weight_decay : 0.0;
      const double adam = v > 0 ? (m / bc1) / (std::sqrt(v / bc2) + o.eps) : 0.0;
      const double want = p0[size_t(i)] - 0.02 * (adam + wd * p0[size_t(i)]);
      // a few float roundings of each term
      ASSERT_NEAR(p[size_t(i)], want, 1e-6 * (std::fabs(p0[size_t(i)]) + 0.02 * (std::fabs(adam) + 1))) << s.name << " " << i;
      if (v > 0) ASSERT_NEAR(opt.m()[size_t(i)], m, 1e-6 * std::fabs(m) + 1e-12) << s.name << " " << i;
    }
}

}  // namespace
}  // namespace loom
