// The model against PyTorch fixtures (tests/reference/write_fixtures.py): logits, loss,
// every gradient, a 10-step AdamW loss trajectory and the final weights, for GPT-2 and
// Llama, on both the fast and the reference kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "loom/model/model.h"
#include "loom/optim/optimizer.h"
#include "loom/core/safetensors.h"
#include "support/model_fixture.h"

namespace loom {
namespace {

struct Fixture {
  StFile file;
  ModelConfig model;
  OptimConfig optim;
  int64_t B = 0, T = 0;
  int steps = 0;
};

Fixture load_fixture(const std::string& name) {
  Fixture f;
  f.file = read_safetensors(std::string(LOOM_FIXTURE_DIR) + "/" + name + ".safetensors");
  f.model = testing_support::fixture_model(f.file);
  auto o = nlohmann::json::parse(f.file.metadata.at("optim"));
  f.optim.lr = o["lr"], f.optim.beta1 = o["betas"][0], f.optim.beta2 = o["betas"][1], f.optim.eps = o["eps"];
  f.optim.weight_decay = o["weight_decay"], f.optim.grad_clip = o["grad_clip"];
  f.steps = o["steps"];
  f.B = std::stoll(f.file.metadata.at("batch"));
  f.T = std::stoll(f.file.metadata.at("seq"));
  return f;
}

void load_params(Model& model, const Fixture& f, const std::string& prefix) {
  for (const ParamSpec& s : model.layout().specs()) {
    std::vector<float> v = f.file.at(prefix + s.name, "fixture").as_f32();
    ASSERT_EQ(int64_t(v.size()), s.numel) << s.name;
    std::copy(v.begin(), v.end(), model.params().begin() + s.offset);
  }
}

using testing_support::rel_err;

class ModelFixture : public ::testing::TestWithParam<std::tuple<std::string, KernelBackend>> {};

TEST_P(ModelFixture, MatchesPyTorch) {
  const auto& [name, backend] = GetParam();
  Fixture f = load_fixture(name);
  Model model(f.model, f.B, f.T, backend);
  load_params(model, f, "param.");
  const auto tokens = f.file.at("tokens", name).as_i32();
  const auto targets = f.file.at("targets", name).as_i32();

  std::vector<float> logits;
  model.forward_logits(tokens.data(), f.B, f.T, logits);
  EXPECT_LT(rel_err(logits.data(), f.file.at("logits", name).as_f32()), 1e-5) << "logits";

  model.zero_grads();
  const float loss = model.forward_backward(tokens.data(), targets.data(), f.B, f.T, 1.0f);
  const float ref_loss = f.file.at("loss", name).as_f32()[0];
  EXPECT_LT(std::fabs(loss - ref_loss) / ref_loss, 1e-5) << loss << " vs " << ref_loss;
  for (const ParamSpec& s : model.layout().specs())
    EXPECT_LT(rel_err(model.grads().data() + s.offset, f.file.at("grad." + s.name, name).as_f32()), 1e-4)
        << "grad of " << s.name;

  // 10 AdamW steps with clipping at a constant lr, same batch each step.
  AdamW opt(model.layout(), f.optim);
  const auto traj = f.file.at("traj", name).as_f32();
  for (int step = 0; step < f.steps; step++) {
    model.zero_grads();
    const float l = model.forward_backward(tokens.data(), targets.data(), f.B, f.T, 1.0f);
    EXPECT_LT(std::fabs(l - traj[step]) / traj[step], 1e-5) << "loss at step " << step;
    clip_grad_norm(model.ops(), model.grads(), f.optim.grad_clip);
    opt.step(model.ops(), model.params(), model.grads(), f.optim.lr);
  }
  // Final weights after 10 chaotic steps: 1e-3 of each tensor's scale. The key bias is
  // excluded: its exact gradient is 0 (adding a constant to every key of a row shifts all
  // scores of that row equally, and softmax ignores shifts), so both sides feed Adam pure
  // rounding noise, which Adam normalises to steps of +-lr in arbitrary directions.
  const int64_t hd = f.model.head_dim(), H = f.model.heads, KV = f.model.kv_heads;
  for (const ParamSpec& s : model.layout().specs()) {
    std::vector<float> ref = f.file.at("final." + s.name, name).as_f32();
    std::vector<float> got(model.params().begin() + s.offset, model.params().begin() + s.offset + s.numel);
    if (s.name.ends_with("attn.qkv.b"))
      for (int64_t i = H * hd; i < (H + KV) * hd; i++) got[i] = ref[i] = 0.0f;
    EXPECT_LT(rel_err(got.data(), ref), 1e-3) << "final weight " << s.name;
  }
}

INSTANTIATE_TEST_SUITE_P(All, ModelFixture,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::Values(KernelBackend::kCpu, KernelBackend::kRef)),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == KernelBackend::kCpu ? "_cpu" : "_ref");
                         });

}  // namespace
}  // namespace loom
