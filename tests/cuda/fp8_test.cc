// Note [CUDA fp8] (cuda/fp8.h): the casts against the host's conversion (the same
// __nv_cvt_float_to_fp8, so byte for byte), the delayed-scaling update against its
// formula, and the fp8 GEMM against a double-precision product of the same fp8 values.
#include <gtest/gtest.h>

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "loom/core/error.h"
#include "loom/cuda/blas.h"
#include "loom/cuda/fp8.h"
#include "loom/cuda/model.h"
#include "loom/model/model.h"
#include "cuda/cuda_model_util.h"
#include "cuda/cuda_test_util.h"

namespace loom::cuda {
namespace {

uint8_t host_fp8(float v, Fp8 f) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == Fp8::kE4m3 ? __NV_E4M3 : __NV_E5M2));
}
// The value of an fp8 byte: e4m3 (bias 7, 3 mantissa bits, no infinities) or e5m2 (bias
// 15, 2 mantissa bits); subnormals where the exponent field is 0.
double decode(uint8_t q, Fp8 f) {
  const int mbits = f == Fp8::kE4m3 ? 3 : 2, bias = f == Fp8::kE4m3 ? 7 : 15;
  const int e = (q & 0x7f) >> mbits, m = q & ((1 << mbits) - 1);
  const double mag = e == 0 ? std::ldexp(double(m), 1 - bias - mbits) : std::ldexp(1.0 + m / double(1 << mbits), e - bias);
  return (q & 0x80) ? -mag : mag;
}

TEST(CudaFp8, CastsMatchTheHostConversionAndTrackAmax) {
  REQUIRE_DEVICE();
  const int64_t R = 70, C = 45;  // not multiples of the 32 x 32 tiles
  // Values up to ~5 sigma times 3, scaled by 100: e4m3 saturates past 448, e5m2 does not.
  const auto x = rounded(randn(static_cast<size_t>(R * C), 3.0f));
  float amax_want = 0.0f;
  for (float v : x) amax_want = std::max(amax_want, std::fabs(v));
  for (Fp8 f : {Fp8::kE4m3, Fp8::kE5m2}) {
    const float scale = 100.0f;
    std::vector<uint8_t> want(x.size()), want_t(x.size());
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) {
        const uint8_t q = host_fp8(x[size_t(r * C + c)] * scale, f);
        want[size_t(r * C + c)] = q, want_t[size_t(c * R + r)] = q;
      }
    Dev<bf16> in(to_h(x));
    Dev<float> sc(std::vector<float>{scale}), amax(std::vector<float>{0.0f}), amax2(amax.n);
    Dev<uint8_t> out(x.size()), out2(x.size()), out_t(x.size());
    cast_fp8(out.p, f, in.p, int64_t(x.size()), sc.p, amax.p, nullptr);
    EXPECT_EQ(out.get(), want) << int(f);
    EXPECT_EQ(amax.get()[0], amax_want) << int(f);
    EXPECT_EQ(cudaMemset(amax2.p, 0, sizeof(float)), cudaSuccess);
    cast_transpose_fp8(out2.p, out_t.p, f, in.p, R, C, sc.p, amax2.p, nullptr);
    EXPECT_EQ(out2.get(), want) << int(f);
    EXPECT_EQ(out_t.get(), want_t) << int(f);
    EXPECT_EQ(amax2.get()[0], amax_want) << int(f);
  }
  // Saturation: 1000 in e4m3 is its largest finite value, 448 (0x7e), not NaN.
  EXPECT_EQ(decode(host_fp8(1000.0f, Fp8::kE4m3), Fp8::kE4m3), 448.0);
  EXPECT_EQ(decode(host_fp8(-1e6f, Fp8::kE5m2), Fp8::kE5m2), -57344.0);
}

// Two tensors in one launch (the second's amaxes halved): each row of the ring its own,
// amax zeroed after each update.
TEST(CudaFp8, DelayedScalingTakesTheRingsMax) {
  REQUIRE_DEVICE();
  const int64_t H = 4, n = 2;
  Dev<float> scale(std::vector<float>(n, 1.0f)), inv(std::vector<float>(n, 1.0f)), hist(std::vector<float>(n * H, 0.0f));
  Dev<float> amax(n);
  const float amaxes[] = {2.0f, 8.0f, 1.0f, 0.5f, 0.25f, 3.0f, 0.0f};
  std::vector<float> ring(H, 0.0f);
  float want = 1.0f;
  for (int64_t step = 0; step < int64_t(std::size(amaxes)); step++) {
    const float both[n] = {amaxes[step], amaxes[step] / 2};
    EXPECT_EQ(cudaMemcpy(amax.p, both, sizeof(both), cudaMemcpyHostToDevice), cudaSuccess);
    fp8_update_scales(scale.p, inv.p, hist.p, amax.p, n, H, step, Fp8::kE4m3, 1, nullptr);
    ring[size_t(step % H)] = amaxes[step];
    const float m = *std::max_element(ring.begin(), ring.end());
    if (m > 0) want = 448.0f / m / 2.0f;
    const std::vector<float> sc = scale.get(), si = inv.get();
    EXPECT_EQ(sc[0], want) << "step " << step;
    EXPECT_EQ(si[0], 1.0f / want) << "step " << step;
    EXPECT_EQ(sc[1], 448.0f / (m / 2) / 2.0f) << "step " << step;
    EXPECT_EQ(amax.get(), std::vector<float>(n, 0.0f)) << "step " << step;
  }
  // Steps 4-6 dropped 8 from the ring: the scale grew back.
  EXPECT_EQ(want, 448.0f / 3.0f / 2.0f);
}

// The products of fp8 values are exact in fp32; Hopper's fp8 tensor cores keep about 14
// bits of their running sum between promotions to fp32 (DeepSeek-V3 report, section 3.3.2),
// so fp32 out is held to 2e-4; bf16 out adds one rounding (2^-9): 4e-3.
TEST(CudaFp8, GemmMatchesTheProductOfItsFp8Values) {
  REQUIRE_DEVICE();
  const int64_t M = 48, N = 80, K = 96;
  Blas blas(nullptr);
  for (auto [at, bt] : {std::pair{Fp8::kE4m3, Fp8::kE4m3}, {Fp8::kE5m2, Fp8::kE4m3}, {Fp8::kE4m3, Fp8::kE5m2}}) {
    const auto a = randn(static_cast<size_t>(M * K)), b = randn(static_cast<size_t>(N * K));
    const float sa = 16.0f, sb = 4.0f;  // the casts' scales; the GEMM gets their inverses
    std::vector<uint8_t> qa(a.size()), qb(b.size());
    for (size_t i = 0; i < a.size(); i++) qa[i] = host_fp8(a[i] * sa, at);
    for (size_t i = 0; i < b.size(); i++) qb[i] = host_fp8(b[i] * sb, bt);
    std::vector<float> want(static_cast<size_t>(M * N));
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += decode(qa[size_t(i * K + k)], at) * decode(qb[size_t(j * K + k)], bt);
        want[size_t(i * N + j)] = float(s / sa / sb);
      }
    Dev<uint8_t> da(qa), db(qb);
    Dev<float> ia(std::vector<float>{1.0f / sa}), ib(std::vector<float>{1.0f / sb});
    Dev<bf16> out(want.size());
    blas.fp8_gemm(out.p, Dt::kBf16, da.p, at, ia.p, db.p, bt, ib.p, M, N, K);
    const double e16 = rel(widen(out.get()), want);
    EXPECT_LT(e16, 4e-3) << int(at) << " x " << int(bt);
    // fp32 out, then accumulated onto (a weight gradient's form): 2 x the product.
    Dev<float> acc(want.size());
    blas.fp8_gemm(acc.p, Dt::kF32, da.p, at, ia.p, db.p, bt, ib.p, M, N, K);
    const double e32 = rel(acc.get(), want);
    EXPECT_LT(e32, 2e-4) << int(at) << " x " << int(bt) << " fp32";
    std::printf("fp8 GEMM %s x %s: relative error bf16 out %.2e, fp32 out %.2e\n", at == Fp8::kE4m3 ? "e4m3" : "e5m2",
                bt == Fp8::kE4m3 ? "e4m3" : "e5m2", e16, e32);
    blas.fp8_gemm(acc.p, Dt::kF32, da.p, at, ia.p, db.p, bt, ib.p, M, N, K, acc.p);
    std::vector<float> twice = want;
    for (float& v : twice) v *= 2.0f;
    EXPECT_LT(rel(acc.get(), twice), 2e-4) << int(at) << " x " << int(bt) << " accumulated";
  }
  Dev<uint8_t> x(static_cast<size_t>(64 * 64));
  Dev<float> one(std::vector<float>{1.0f});
  Dev<bf16> out(static_cast<size_t>(64 * 64));
  EXPECT_THROW(blas.fp8_gemm(out.p, Dt::kBf16, x.p, Fp8::kE5m2, one.p, x.p, Fp8::kE5m2, one.p, 64, 64, 64), Error);
  EXPECT_THROW(blas.fp8_gemm(out.p, Dt::kBf16, x.p, Fp8::kE4m3, one.p, x.p, Fp8::kE4m3, one.p, 64, 64, 40), Error);
  Dev<float> scales(std::vector<float>(8, 1.0f));  // a scale 4 bytes past a 16-byte boundary
  EXPECT_THROW(blas.fp8_gemm(out.p, Dt::kBf16, x.p, Fp8::kE4m3, scales.p, x.p, Fp8::kE4m3, scales.p + 1, 64, 64, 64),
               Error);
}

// The Llama with fp8 linear layers (Note [CUDA fp8 linear layers]) against its bf16 self
// from the same weights and tokens, after two steps of lr 0 (the weights stay; the scale
// updates run) so that every cast uses delayed scales. e4m3 keeps 3 mantissa bits (2^-4
// relative rounding) and e5m2 gradients 2: the loss within 2e-2, every gradient tensor
// within 0.25 (an operand transposed or a scale misapplied gives errors near 1 or above).
TEST(CudaFp8, LlamaLinearLayersStayNearTheBf16Model) {
  REQUIRE_DEVICE();
  ModelConfig m;
  m.arch = Arch::kLlama, m.layers = 2, m.d_model = 128, m.heads = 4, m.kv_heads = 2, m.ffn = 176, m.vocab = 97;
  m.ctx = 32;
  const int64_t B = 3, T = 32;
  const CpuReference r(m, B, T);
  const Model& cpu = r.cpu;
  const std::vector<int32_t>& tok = r.tok;
  const std::vector<int32_t>& tgt = r.tgt;
  CudaModel ref(m, B, T), f8(m, B, T, true, {}, true);
  ref.upload_params(cpu.params());
  f8.upload_params(cpu.params());
  OptimConfig o;
  for (int64_t step = 1; step <= 2; step++) {
    f8.zero_grads();
    f8.forward_backward(tok.data(), tgt.data(), B, T, 1.0f);
    f8.take_loss();
    f8.adamw_step(o, 0.0, step, 1.0);
  }
  EXPECT_EQ(f8.download_params(), cpu.params()) << "lr 0 moved the weights";
  double loss[2];
  std::vector<float> grads[2];
  for (int i = 0; i < 2; i++) {
    CudaModel& model = i == 0 ? ref : f8;
    model.zero_grads();
    model.forward_backward(tok.data(), tgt.data(), B, T, 1.0f);
    loss[i] = model.take_loss();
    grads[i] = model.download_grads();
  }
  EXPECT_NEAR(loss[1], loss[0], 2e-2 * loss[0]);
  double worst = 0;
  for (const ParamSpec& sp : ref.layout().specs()) {
    const std::vector<float> a(grads[1].begin() + sp.offset, grads[1].begin() + sp.offset + sp.numel);
    const std::vector<float> b(grads[0].begin() + sp.offset, grads[0].begin() + sp.offset + sp.numel);
    const double e = rel(a, b);
    EXPECT_LT(e, 0.25) << sp.name;
    worst = std::max(worst, e);
  }
  std::printf("fp8 Llama vs bf16: loss %.5f vs %.5f, worst gradient tensor relative error %.3f\n", loss[1], loss[0],
              worst);
}

}  // namespace
}  // namespace loom::cuda
