// bf16 kernels on oneDNN's matmul primitive (AVX512-BF16 / AMX kernels where the CPU has
// them): contracts in kernels/ops_bf16.inc. Threads: OpenMP's current maximum.
#pragma once

#include <cstdint>

#include "loom/core/bf16.h"

namespace loom::cpu {

#include "loom/kernels/ops_bf16.inc"


// C(M,N) = A(M,K) B(N,K)^T + bias(N) on every row, the bias added to the fp32 accumulator
// (matmul_forward_bf16_in's GEMM; contiguous operands). Equals gemm_bf16 into a C holding
// the bias with beta = 1, in fewer passes over C.
void gemm_bf16_bias_nt(int64_t M, int64_t N, int64_t K, const bf16* A, const bf16* B, const float* bias, float* C);

// The name of the ISA oneDNN dispatches to here (e.g. "avx512_core_bf16"), for reports.
const char* gemm_bf16_isa();

}  // namespace loom::cpu
