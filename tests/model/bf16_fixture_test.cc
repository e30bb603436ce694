// train.precision = bf16 against PyTorch (tests/reference/write_bf16_fixtures.py), for
// GPT-2 and Llama on the fast and the reference kernels:
//   sem.*: loom's own bf16 rounding points computed in fp64 by PyTorch, an exact-semantics
//          oracle: loom differs from it by fp32 arithmetic, plus the rare GEMM input that
//          fp32 noise moves across a bf16 rounding boundary (2^-8 of that one value).
//   ac.*:  PyTorch's torch.autocast("cpu", bfloat16), which also stores every linear output,
//          the attention scores and probabilities and the activations in bf16: a bf16-level
//          distance, several roundings of 2^-8 deep.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "loom/model/model.h"
#include "loom/core/safetensors.h"
#include "support/model_fixture.h"

namespace loom {
namespace {

using testing_support::rel_err;

struct Bounds {
  double logits, loss, grads;
};

class Bf16Fixture : public ::testing::TestWithParam<std::tuple<std::string, KernelBackend>> {};

TEST_P(Bf16Fixture, MatchesPyTorch) {
  const auto& [name, backend] = GetParam();
  const StFile f = read_safetensors(std::string(LOOM_FIXTURE_DIR) + "/" + name + "_bf16.safetensors");
  const ModelConfig m = testing_support::fixture_model(f);
  const int64_t B = std::stoll(f.metadata.at("batch")), T = std::stoll(f.metadata.at("seq"));
  ModelOptions o;
  o.precision = Precision::kBf16;
  Model model(m, B, T, backend, o);
  for (const ParamSpec& s : model.layout().specs()) {
    const std::vector<float> v = f.at("param." + s.name, name).as_f32();
    ASSERT_EQ(int64_t(v.size()), s.numel) << s.name;
    std::copy(v.begin(), v.end(), model.params().begin() + s.offset);
  }
  const auto tokens = f.at("tokens", name).as_i32(), targets = f.at("targets", name).as_i32();
  std::vector<float> logits;
  model.forward_logits(tokens.data(), B, T, logits);
  model.zero_grads();
  const float loss = model.forward_backward(tokens.data(), targets.data(), B, T, 1.0f);
  // Observed (max |diff| / max |ref| per tensor): vs sem, logits <= 1.1e-7 and the loss
  // equal on both kernel sets; gradients <= 2.4e-7 but for one Llama gradient at 2.7e-4 (a
  // qkv value next to a bf16 rounding boundary that fp32 and fp64 round the other way; the
  // bf16 precision test sees flips up to 3.3e-3). vs autocast: logits 0.8-1.0e-2, loss
  // 0.6-3.3e-4, gradients <= 1.3e-2. Bounds: sem 1e-5 / 1e-5 / 2e-2 (one flip is 2^-8 of a
  // value); autocast about 5x what was seen.
  for (const auto& [ref, b] : {std::pair<std::string, Bounds>{"sem", {1e-5, 1e-5, 2e-2}},
                               std::pair<std::string, Bounds>{"ac", {5e-2, 2e-3, 6e-2}}}) {
    const double el = rel_err(logits.data(), f.at(ref + ".logits", name).as_f32());
    const float rl = f.at(ref + ".loss", name).as_f32()[0];
    double eg = 0;
    for (const ParamSpec& s : model.layout().specs()) {
      const double e = rel_err(model.grads().data() + s.offset, f.at(ref + ".grad." + s.name, name).as_f32());
      EXPECT_LT(e, b.grads) << ref << " gradient of " << s.name;
      eg = std::max(eg, e);
    }
    EXPECT_LT(el, b.logits) << ref << " logits";
    EXPECT_LT(std::fabs(loss - rl) / rl, b.loss) << ref << " loss " << loss << " vs " << rl;
    std::cout << name << " " << model.ops().backend << " vs " << ref << ": logits " << el << ", loss "
              << std::fabs(loss - rl) / rl << ", worst gradient " << eg << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(All, Bf16Fixture,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::Values(KernelBackend::kCpu, KernelBackend::kRef)),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == KernelBackend::kCpu ? "_cpu" : "_ref");
                         });

}  // namespace
}  // namespace loom
