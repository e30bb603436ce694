#include "loom/kernels/cpu/gemm_bf16.h"

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

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

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  LOOM_ASSERT(M > 0 && N > 0 && K > 0);
  LOOM_ASSERT(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N);
  const Prim& p = primitive({trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta});
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
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni (bf16 emulated)";
    case dnnl::cpu_isa::avx512_core: return "avx512_core (bf16 emulated)";
    default: return "below avx512 (bf16 emulated)";
  }
}

}  // namespace loom::cpu
