// bf16 kernels on oneDNN's matmul primitive (AVX512-BF16 / AMX kernels where the CPU has
// them): contracts in kernels/ops_bf16.inc. Threads: OpenMP's current maximum.
#pragma once

#include <cstdint>

#include "loom/core/bf16.h"

namespace loom::cpu {

#include "loom/kernels/ops_bf16.inc"


// The name of the ISA oneDNN dispatches to here (e.g. "avx512_core_bf16"), for reports.
const char* gemm_bf16_isa();

}  // namespace loom::cpu
