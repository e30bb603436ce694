#include "loom/kernels/cpu/gemm_bf16.h"

#include <cblas.h>

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
using Shape = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

struct Prim {
  dnnl::memory::desc a, b, c;
  dnnl::matmul mm;
};

// One primitive per shape, built on first use (oneDNN JIT-generates its kernel then).
const Prim& primitive(const Shape& s) {
  thread_local std::map<Shape, Prim> cache;
  auto it = cache.find(s);
  if (it != cache.end()) return it->second;
  const auto [ta, tb, M, N, K, lda, ldb, ldc, alpha, beta] = s;
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
  const dnnl::matmul::desc d(p.a, p.b, p.c);
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
                  const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  thread_local std::vector<float> a, b;
  const float* af = ta ? widen(a, A, K, M, lda) : widen(a, A, M, K, lda);
  const float* bf = tb ? widen(b, B, N, K, ldb) : widen(b, B, K, N, ldb);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, af, int(lda), bf, int(ldb), beta, C, int(ldc));
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  LOOM_ASSERT(M > 0 && N > 0 && K > 0);
  LOOM_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N);
  if (g_widened.load(std::memory_order_relaxed))
    return gemm_widened(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const Prim* pp = nullptr;
  try {
    pp = &primitive({trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta});
  } catch (const dnnl::error&) {  // Note [bf16 GEMM without AVX-512]
    g_widened = true;
    return gemm_widened(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  const Prim& p = *pp;
  dnnl::engine& e = cpu_engine();
  dnnl::memory a(p.a, e, const_cast<bf16*>(A)), b(p.b, e, const_cast<bf16*>(B)), c(p.c, e, C);
  thread_local dnnl::stream st(e);
  p.mm.execute(st, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  st.wait();
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
