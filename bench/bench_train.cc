// loom's side of the training benchmark (bench/train_vs_torch.sh runs the PyTorch peer).
// Measures, in one process: the 2-thread GEMM peak of this machine in the run's precision
// (sgemm, or oneDNN's bf16 GEMM for bf16; the shapes of the model's largest layer and a
// square 2048^3), then training tokens/s of one config with random tokens, achieved model
// FLOP/s (6 * params + 12 * L * T * d per token), the model's activation bytes (its carve:
// saved activations and backward scratch) and peak RSS. Prints one JSON line.
// Usage: bench_train A|B|C [steps] [fp32|bf16] [moments: fp32|bf16 (optim.moments)]
#include <cblas.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/blas_info.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/model/model.h"
#include "loom/optim/optimizer.h"

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Best-of-5 GFLOP/s of C(M,N) = A(M,K) B(N,K)^T, in fp32 (sgemm) or bf16 (oneDNN).
double gemm_gflops(int64_t M, int64_t N, int64_t K, bool bf16) {
  std::vector<float> a(M * K, 0.5f), b(N * K, 0.25f), c(M * N);
  std::vector<loom::bf16> ah(a.size(), loom::to_bf16(0.5f)), bh(b.size(), loom::to_bf16(0.25f));
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    auto t = Clock::now();
    if (bf16)
      cpu::gemm_bf16(false, true, M, N, K, 1.0f, ah.data(), K, bh.data(), K, 0.0f, c.data(), N);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    best = std::max(best, 2.0 * M * N * K / seconds_since(t) / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = argc > 1 ? argv[1] : "A";
  int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::string precision = argc > 3 ? argv[3] : "fp32";
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "bench_train: precision '%s': expected fp32 or bf16\n", precision.c_str());
    return 2;
  }
  const bool bf16 = precision == "bf16";
  const std::string moments = argc > 4 ? argv[4] : "fp32";
  std::vector<std::string> sets = {"optim.moments=" + moments};
  int64_t batch = 16;
  if (name == "A") sets.push_back("model.preset=tiny"), batch = 16;
  else if (name == "B") sets.insert(sets.end(), {"model.preset=gpt2", "model.layers=6", "model.d_model=384", "model.heads=6", "model.ffn=1536", "model.ctx=256"}), batch = 8;
  else if (name == "C") sets.insert(sets.end(), {"model.preset=gpt2", "model.ctx=256"}), batch = 4;
  else {
    std::fprintf(stderr, "usage: bench_train A|B|C [steps]\n");
    return 2;
  }
  Config cfg;
  try {
    cfg = load_config("", sets);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 2;
  }
  const ModelConfig& m = cfg.model;
  // bench/torch_peer.py builds its MLP as 4 x d_model: both sides must run the same model.
  if (m.ffn != 4 * m.d_model) {
    std::fprintf(stderr, "bench_train: config %s has ffn %ld, but the PyTorch peer uses 4 x d_model = %ld\n",
                 name.c_str(), long(m.ffn), long(4 * m.d_model));
    return 2;
  }
  const int64_t T = m.ctx;
  ModelOptions mo;
  mo.precision = bf16 ? Precision::kBf16 : Precision::kFp32;
  Model model(m, batch, T, KernelBackend::kCpu, mo);
  model.init_weights(1);
  AdamW opt(model.layout(), cfg.optim);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(m.vocab - 1));
  std::vector<int32_t> x(batch * T), y(batch * T);
  for (auto& v : x) v = tok(rng);
  for (auto& v : y) v = tok(rng);

  const int warmup = 2;
  Clock::time_point t0;
  for (int s = 0; s < warmup + steps; s++) {
    if (s == warmup) t0 = Clock::now();
    model.zero_grads();
    model.forward_backward(x.data(), y.data(), batch, T, 1.0f);
    // As loom train's Updater: the clipping coefficient rides in AdamW (no scale pass).
    const double norm = std::sqrt(model.ops().sum_squares(model.grads().data(), int64_t(model.grads().size())));
    opt.step(model.ops(), model.params(), model.grads(), 1e-4, {}, {}, float(clip_coef(norm, 1.0)));
  }
  const double dt = seconds_since(t0);
  const double tok_s = double(steps) * batch * T / dt;
  const double params = double(model.layout().param_count());
  const double flops_per_token = 6.0 * params + 12.0 * m.layers * T * m.d_model;
  const double gflops = tok_s * flops_per_token / 1e9;
  const double peak_sq = gemm_gflops(2048, 2048, 2048, bf16);
  const double peak_model = gemm_gflops(batch * T, m.ffn, m.d_model, bf16);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("{\"side\":\"loom\",\"config\":\"%s\",\"precision\":\"%s\",\"moments\":\"%s\",\"tokens_per_s\":%.1f,\"model_gflops\":%.1f,"
              "\"gemm_peak_gflops\":%.1f,\"gemm_fc_shape_gflops\":%.1f,\"activation_mib\":%.1f,\"peak_rss_mib\":%.1f,"
              "\"blas_core\":\"%s\"}\n",
              name.c_str(), precision.c_str(), moments.c_str(), tok_s, gflops, peak_sq, peak_model,
              double(model.activation_bytes()) / (1 << 20), ru.ru_maxrss / 1024.0,
              cpu::blas_core_name().c_str());
  return 0;
}
