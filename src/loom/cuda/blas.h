// GEMMs of the CUDA backend: row-major wrappers over cuBLASLt (the linear layers, with the
// bias folded into the GEMM's epilogue and the residual add into its C operand) and over
// cublasGemmStridedBatchedEx (attention). A and B are bf16; C/D fp32 or bf16; every sum
// is fp32 (CUBLAS_COMPUTE_32F). Plans are looked up once per shape and cached.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "loom/core/bf16.h"
#include "loom/cuda/fp8.h"

namespace loom::cuda {

enum class Dt { kBf16, kF32 };

class Blas {
 public:
  explicit Blas(cudaStream_t s);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // out(N,OC) = inp(N,IC) @ w(OC,IC)^T [+ bias(OC)] [+ residual(N,OC)]. bias has out's type
  // (the fp32 master or its bf16 copy); residual only with an fp32 out (it may be out itself).
  // ld: the row stride of out (and of dout below) when it is not OC (a padded vocabulary).
  void linear_forward(void* out, Dt out_type, const bf16* inp, const bf16* w, const void* bias,
                      const float* residual, int64_t N, int64_t IC, int64_t OC, int64_t ld = 0);
  // dinp(N,IC) = (or += when accumulate, fp32 only) dout(N,OC) @ w(OC,IC).
  void linear_backward_input(void* dinp, Dt type, const bf16* dout, const bf16* w, int64_t N, int64_t IC, int64_t OC,
                             bool accumulate = false, int64_t ld = 0);
  // dw(OC,IC) += dout(N,OC)^T @ inp(N,IC), fp32.
  void linear_backward_weight(float* dw, const bf16* dout, const bf16* inp, int64_t N, int64_t IC, int64_t OC,
                              int64_t ld = 0);
  // GPT's MLP activation in the GEMM's epilogue (cuBLASLt GELU_AUX_BIAS): pre(N,OC) = inp @
  // w^T + bias and act = gelu(pre) (the tanh form, from the fp32 sum), both bf16. False,
  // with nothing written, where cuBLASLt has no algorithm for it: the caller then runs
  // linear_forward and ops.h gelu_forward.
  bool linear_forward_gelu(bf16* act, bf16* pre, const bf16* inp, const bf16* w, const bf16* bias, int64_t N,
                           int64_t IC, int64_t OC);
  // dpre(N,IC) = gelu'(pre) * (dout(N,OC) @ w(OC,IC)), bf16 (the DGELU epilogue: the
  // derivative at the bf16 pre-activation times the fp32 sum). False as above (then
  // linear_backward_input and ops.h gelu_backward).
  bool linear_backward_input_dgelu(bf16* dpre, const bf16* dout, const bf16* w, const bf16* pre, int64_t N,
                                   int64_t IC, int64_t OC);

  // Row-major per batch item b < batch: C_b(M,N) = alpha op(A_b)(M,K) op(B_b)(K,N) + beta C_b,
  // op(X) = X^T when its flag is set (X then stored (K,M) or (N,K)); strides in elements.
  struct Batched {
    bool ta = false, tb = false;
    int64_t M = 0, N = 0, K = 0;
    const bf16* A = nullptr;
    int64_t lda = 0, sa = 0;
    const bf16* B = nullptr;
    int64_t ldb = 0, sb = 0;
    void* C = nullptr;
    Dt ct = Dt::kF32;
    int64_t ldc = 0, sc = 0;
    int64_t batch = 1;
    float alpha = 1, beta = 0;
  };
  void batched(const Batched& g);

  // out(M,N) = *a_scale_inv *b_scale_inv A(M,K) B(N,K)^T [+ c(M,N)] (Note [CUDA fp8]): A and
  // B fp8 of formats at and bt, row-major with K contiguous (Hopper's fp8 "TN" form), not
  // both e5m2; the scale_inv are device scalars, each 16-byte aligned; out bf16 (a forward
  // or backward-input GEMM) or fp32, the only type with c (a residual, or out itself: a
  // weight gradient accumulated). M, N and K multiples of 16 (cuBLASLt's fp8 alignment);
  // else loom::Error naming the shape. fp32 sums, with the fp8 MMA's fast accumulation off
  // (Transformer Engine keeps it off for the gradients' GEMMs).
  void fp8_gemm(void* out, Dt out_type, const uint8_t* A, Fp8 at, const float* a_scale_inv, const uint8_t* B, Fp8 bt,
                const float* b_scale_inv, int64_t M, int64_t N, int64_t K, const float* c = nullptr);

 private:
  struct Plan;
  // The epilogue beyond the bias: none, GELU with its input stored to aux, or GELU's
  // derivative at aux times the product.
  enum class Epi { kNone, kGeluAux, kDgelu };
  // Row-major D(M,N) = op(A) op(B) + beta C (C = D when c is null) [+ bias(N)] [epilogue
  // with aux (M,N), row stride ldd]. False where cuBLASLt has no algorithm for a GELU
  // epilogue (remembered per shape); other failures throw.
  cublasLtMatmulAlgo_t fastest(Plan& p, const cublasLtMatmulHeuristicResult_t* res, int found, const void* A,
                               const void* B, const void* c, Dt dt, int64_t d_elems, float beta, const void* bias);
  int candidates(Plan& p, cublasLtMatmulHeuristicResult_t* res, const std::string& shape);
  bool lt(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, const bf16* B, int64_t ldb,
          const void* c, void* D, Dt dt, int64_t ldd, float beta, const void* bias, Epi epi = Epi::kNone,
          const bf16* aux = nullptr);
  cudaStream_t stream_;
  void* lt_ = nullptr;      // cublasLtHandle_t
  void* cublas_ = nullptr;  // cublasHandle_t
  void* workspace_ = nullptr;
  std::map<std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, bool, int>,
           std::unique_ptr<Plan>>
      plans_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int, int, bool>, std::unique_ptr<Plan>>
      fp8_plans_;  // M, N, K, at, bt, out type, with c
};

}  // namespace loom::cuda
