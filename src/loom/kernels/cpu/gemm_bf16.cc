#include "loom/kernels/cpu/gemm_bf16.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "loom/core/error.h"

namespace loom::cpu {

namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Every field a matmul primitive depends on.
using Shape = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, bool>;

struct Prim {
  dnnl::memory::desc a, b, c, bias;
  dnnl::matmul mm;
};

// One primitive per shape, built on first use (oneDNN JIT-generates its kernel then).
const Prim& primitive(const Shape& s) {
  thread_local std::map<Shape, Prim> cache;
  auto it = cache.find(s);
  if (it != cache.end()) return it->second;
  const auto [ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, with_bias] = s;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  Prim p;
  // Strides express the transposes: element (m, k) of op(A) sits at m lda + k, or k lda + m.
  p.a = dnnl::memory::desc(dims{M, K}, dt::bf16, ta ? dims{1, lda} : dims{lda, 1});
  p.b = dnnl::memory::desc(dims{K, N}, dt::bf16, tb ? dims{1, ldb} : dims{ldb, 1});
  p.c = dnnl::memory::desc(dims{M, N}, dt::f32, dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);  // C = alpha A B + beta C
    attr.set_post_ops(ops);
  }
  // The bias (one fp32 row, added to every row of the fp32 accumulator) rides in the
  // primitive: a copy into C and a sum post-op cost 18-24% of the GEMM (Note [Blocked oneDNN GEMMs]).
  if (with_bias) p.bias = dnnl::memory::desc(dims{1, N}, dt::f32, dims{N, 1});
  const dnnl::matmul::desc d = with_bias ? dnnl::matmul::desc(p.a, p.b, p.bias, p.c) : dnnl::matmul::desc(p.a, p.b, p.c);
  p.mm = dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, cpu_engine()));
  return cache.emplace(s, std::move(p)).first->second;
}

// Note [bf16 GEMM without AVX-512]
// oneDNN 2.6 has no bf16 matmul below AVX-512 (some machines this project runs on are
// AVX2-only). There the inputs are widened to fp32, exactly (a bf16 is the top half of an
// fp32), and multiplied by OpenBLAS sgemm: products of two bf16 values are exact in fp32
// and the sums accumulate in fp32, so the rounding points are those of the oneDNN path
// (Note [bf16 rounding points]); only the summation order differs, as between any two
// GEMMs, and there is no speed-up. gemm_bf16_isa() says which path runs.
std::atomic<bool> g_widened{false};

// The `rows` x `ld` strided block holding a GEMM operand, widened to fp32 in `out`.
const float* widen(std::vector<float>& out, const bf16* x, int64_t rows, int64_t cols, int64_t ld) {
  out.resize(size_t((rows - 1) * ld + cols));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) out[size_t(r * ld + c)] = loom::from_bf16(x[r * ld + c]);
  return out.data();
}

void gemm_widened(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                  const bf16* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  thread_local std::vector<float> a, b;
  if (bias) {  // C = bias + alpha A B (the callers pass beta = 0 with a bias)
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; m++) std::copy(bias, bias + N, C + m * ldc);
    beta = 1.0f;
  }
  const float* af = ta ? widen(a, A, K, M, lda) : widen(a, A, M, K, lda);
  const float* bf = tb ? widen(b, B, N, K, ldb) : widen(b, B, K, N, ldb);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, af, int(lda), bf, int(ldb), beta, C, int(ldc));
}

// Note [Blocked oneDNN GEMMs]
// oneDNN 2.6's bf16 matmul slows down on a dimension of tens of thousands - the vocabulary
// of a language-model head - where the same work cut into blocks of a few thousand runs
// near its peak. Measured on this project's 2-core AVX512-BF16 machine (GFLOP/s, GPT-2 head:
// N 1024 tokens, C 768, V 50257): dW = dlogits^T x (M = V, A transposed) 576 whole, 822 in
// blocks of 4,096 rows; dx = dlogits W (K = V) 733 whole, 912 in blocks of 8,192; logits =
// x W^T (N = V) 884 whole, 935 in blocks of 8,192; config B's head chunk (256 tokens, C 384):
// dW 438 whole, 760 blocked. OpenBLAS sgemm runs these shapes at its peak either way. So a
// dimension above kSplitAbove is cut into near-equal blocks of at most kBlock: rows of C (M,
// when A is transposed: untransposed, 16,385 x 768 x 768 ran at 844 cut in two against
// 914 whole) and columns of C (N) as separate GEMMs over disjoint outputs; the inner
// dimension (K) as GEMMs accumulating into C (beta for the first block, 1 after), which
// changes only the order of the fp32 sums (Note [bf16 rounding points]: no new rounding).
constexpr int64_t kSplitAbove = 16384, kBlock = 8192, kBlockTransA = 4096;

// The block length cutting n into near-equal blocks of at most `most` (a multiple of 64),
// rounded up to a multiple of 64 (odd lengths ran up to 8% slower).
int64_t block_of(int64_t n, int64_t most) {
  const int64_t blocks = (n + most - 1) / most;
  return ((n + blocks - 1) / blocks + 63) / 64 * 64;
}

void gemm_one(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
              const bf16* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc);

// C = alpha op(A) op(B) + beta C (+ bias on every row, beta = 0 then), blocked.
void gemm_blocked(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                  const bf16* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  LOOM_ASSERT(M > 0 && N > 0 && K > 0 && (!bias || beta == 0.0f));
  LOOM_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N);
  // Note [Blocked oneDNN GEMMs]. Element (m, k) of op(A): A[m lda + k], or A[k lda + m]
  // when trans_a; (k, n) of op(B): B[k ldb + n], or B[n ldb + k] when trans_b.
  if (trans_a && M > kSplitAbove) {
    const int64_t b = block_of(M, kBlockTransA);
    for (int64_t m0 = 0; m0 < M; m0 += b)
      gemm_blocked(trans_a, trans_b, std::min(b, M - m0), N, K, alpha, A + m0, lda, B, ldb, beta, bias, C + m0 * ldc,
                   ldc);
    return;
  }
  if (N > kSplitAbove) {
    const int64_t b = block_of(N, kBlock);
    for (int64_t n0 = 0; n0 < N; n0 += b)
      gemm_blocked(trans_a, trans_b, M, std::min(b, N - n0), K, alpha, A, lda, B + (trans_b ? n0 * ldb : n0), ldb, beta,
                   bias ? bias + n0 : nullptr, C + n0, ldc);
    return;
  }
  if (K > kSplitAbove) {
    const int64_t b = block_of(K, kBlock);
    for (int64_t k0 = 0; k0 < K; k0 += b)
      gemm_one(trans_a, trans_b, M, N, std::min(b, K - k0), alpha, A + (trans_a ? k0 * lda : k0), lda,
               B + (trans_b ? k0 : k0 * ldb), ldb, k0 == 0 ? beta : 1.0f, k0 == 0 ? bias : nullptr, C, ldc);
    return;
  }
  gemm_one(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
}

void gemm_one(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
              const bf16* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  if (g_widened.load(std::memory_order_relaxed))
    return gemm_widened(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
  const Prim* pp = nullptr;
  try {
    pp = &primitive({trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta, bias != nullptr});
  } catch (const dnnl::error&) {  // Note [bf16 GEMM without AVX-512]
    g_widened = true;
    return gemm_widened(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
  }
  const Prim& p = *pp;
  dnnl::engine& e = cpu_engine();
  dnnl::memory a(p.a, e, const_cast<bf16*>(A)), b(p.b, e, const_cast<bf16*>(B)), c(p.c, e, C);
  thread_local dnnl::stream st(e);
  if (bias) {
    dnnl::memory bm(p.bias, e, const_cast<float*>(bias));
    p.mm.execute(st, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_BIAS, bm}, {DNNL_ARG_DST, c}});
  } else {
    p.mm.execute(st, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  }
  st.wait();
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_blocked(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, nullptr, C, ldc);
}

void gemm_bf16_bias_nt(int64_t M, int64_t N, int64_t K, const bf16* A, const bf16* B, const float* bias, float* C) {
  gemm_blocked(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, bias, C, N);
}

void to_bf16(bf16* out, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) out[i] = loom::to_bf16(in[i]);
}

const char* gemm_bf16_isa() {
  if (g_widened) return "no oneDNN bf16 matmul on this CPU: OpenBLAS sgemm on the widened bf16 inputs";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni (bf16 emulated)";
    case dnnl::cpu_isa::avx512_core: return "avx512_core (bf16 emulated)";
    default: return "below avx512 (bf16 emulated)";
  }
}

}  // namespace loom::cpu
