// bf16 GEMM peak on this CPU (issue 14: choose, measure, and say why). For the GEMM shapes of
// config C (GPT-2 124M, T 256, B 4: 1,024 tokens per micro-batch) and config B's head, the
// weight gradients' transposed-A GEMMs and the head's backward (through the blocking of Note
// [Blocked oneDNN GEMMs]: its "whole" numbers are in docs/log/benchmarks.md):
//   OpenBLAS sgemm (fp32, loom's current path);
//   oneDNN matmul bf16 x bf16 -> fp32 (cpu::gemm_bf16), inputs already bf16;
//   the same plus converting both fp32 inputs to bf16 first (the cost of casting per call);
//   libxsmm 1.17 libxsmm_bsgemm, when built with it (LOOM_HAVE_LIBXSMM), on the small shapes.
// Usage: build/release/bench/gemm_bf16 [seconds per case]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "loom/kernels/cpu/gemm_bf16.h"

#ifdef LOOM_HAVE_LIBXSMM
#include <libxsmm.h>
#endif

namespace {

// Best of repeated runs over about `seconds`, in seconds per call.
double best_time(const std::function<void()>& fn, double seconds) {
  using Clock = std::chrono::steady_clock;
  fn();  // warm-up: JIT, page faults
  double best = 1e30, spent = 0;
  for (int i = 0; i < 3 || spent < seconds; i++) {
    const auto t0 = Clock::now();
    fn();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, dt);
    spent += dt;
  }
  return best;
}

struct Case {
  const char* what;
  int64_t M, N, K;
  bool trans_b;          // forward GEMMs read W (N,K) transposed, as loom's matmul does
  bool trans_a = false;  // weight gradients read dY (K,M) transposed: dW = dY^T X
};

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
#ifdef LOOM_HAVE_LIBXSMM
  libxsmm_init();
#endif
  const std::vector<Case> cases = {
      {"C qkv forward   (1024 x 768 -> 2304)", 1024, 2304, 768, true},
      {"C attn proj fwd (1024 x 768 -> 768)", 1024, 768, 768, true},
      {"C fc forward    (1024 x 768 -> 3072)", 1024, 3072, 768, true},
      {"C fc2 forward   (1024 x 3072 -> 768)", 1024, 768, 3072, true},
      {"C fc dX         (1024 x 3072 -> 768)", 1024, 768, 3072, false},
      {"C lm head fwd   (1024 x 768 -> 50257)", 1024, 50257, 768, true},
      {"B head chunk    (256 x 384 -> 50257)", 256, 50257, 384, true},
      {"C fc dW    (3072 x 768, K 1024, A^T)", 3072, 768, 1024, false, true},
      {"C head dW  (50257 x 768, K 1024, A^T)", 50257, 768, 1024, false, true},
      {"C lm head dX    (1024 x 50257 -> 768)", 1024, 768, 50257, false},
      {"small           (64 x 64 -> 64)", 64, 64, 64, true},
  };
  std::printf("threads %d, oneDNN ISA %s\n", omp_get_max_threads(), loom::cpu::gemm_bf16_isa());
  std::printf("%-40s %10s %10s %10s %8s %10s\n", "GEMM", "sgemm", "bf16", "bf16+cast", "bf16/fp32", "libxsmm");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  double sum_fp32 = 0, sum_bf16 = 0;
  for (const Case& c : cases) {
    std::vector<float> a(size_t(c.M * c.K)), b(size_t(c.N * c.K)), out(size_t(c.M * c.N));
    for (auto& x : a) x = nd(rng);
    for (auto& x : b) x = nd(rng);
    std::vector<loom::bf16> ah(a.size()), bh(b.size());
    loom::cpu::to_bf16(ah.data(), a.data(), int64_t(a.size()));
    loom::cpu::to_bf16(bh.data(), b.data(), int64_t(b.size()));
    const int64_t ldb = c.trans_b ? c.K : c.N, lda = c.trans_a ? c.M : c.K;
    const double flop = 2.0 * double(c.M) * double(c.N) * double(c.K);
    const double t32 = best_time([&] {
      cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans, c.trans_b ? CblasTrans : CblasNoTrans, int(c.M),
                  int(c.N), int(c.K), 1.0f, a.data(), int(lda), b.data(), int(ldb), 0.0f, out.data(), int(c.N));
    }, seconds);
    const double t16 = best_time([&] {
      loom::cpu::gemm_bf16(c.trans_a, c.trans_b, c.M, c.N, c.K, 1.0f, ah.data(), lda, bh.data(), ldb, 0.0f, out.data(),
                           c.N);
    }, seconds);
    const double tcast = best_time([&] {
      loom::cpu::to_bf16(ah.data(), a.data(), int64_t(a.size()));
      loom::cpu::to_bf16(bh.data(), b.data(), int64_t(b.size()));
      loom::cpu::gemm_bf16(c.trans_a, c.trans_b, c.M, c.N, c.K, 1.0f, ah.data(), lda, bh.data(), ldb, 0.0f, out.data(),
                           c.N);
    }, seconds);
    std::string xsmm = "-";
#ifdef LOOM_HAVE_LIBXSMM
    if (flop < 1e7 && !c.trans_a) {  // libxsmm targets small GEMMs (its JIT covers up to ~64^3 here)
      // Column-major BLAS convention: C^T (N,M) = op(B)^T (N,K) A^T (K,M).
      const libxsmm_blasint m = c.N, n = c.M, k = c.K, lda = ldb, ldbb = c.K, ldc = c.N;
      const float alpha = 1, beta = 0;
      const char ta = c.trans_b ? 'T' : 'N', tb = 'N';
      const double tx = best_time([&] {
        libxsmm_bsgemm(&ta, &tb, &m, &n, &k, &alpha, reinterpret_cast<const libxsmm_bfloat16*>(bh.data()), &lda,
                       reinterpret_cast<const libxsmm_bfloat16*>(ah.data()), &ldbb, &beta, out.data(), &ldc);
      }, seconds);
      xsmm = std::to_string(int(flop / tx / 1e9));
    }
#endif
    sum_fp32 += t32, sum_bf16 += t16;
    std::printf("%-40s %10.0f %10.0f %10.0f %7.2fx %10s\n", c.what, flop / t32 / 1e9, flop / t16 / 1e9,
                flop / tcast / 1e9, t32 / t16, xsmm.c_str());
  }
  std::printf("GFLOP/s per case (best of repeats). All cases: bf16 takes %.2fx less time than sgemm.\n",
              sum_fp32 / sum_bf16);
  return 0;
}
