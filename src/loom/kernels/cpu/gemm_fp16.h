// fp16 kernels (contracts in kernels/ops_fp16.inc), in cpu/matmul.cc: the GEMM inputs
// rounded to fp16 into fp32 scratch, then OpenBLAS sgemm. This CPU has no fp16 GEMM
// instructions (no AVX512-FP16 or AMX-FP16); the mode exists to exercise fp16's range
// and dynamic loss scaling for the GPU path, not for speed.
#pragma once

#include <cstdint>

namespace loom::cpu {

#include "loom/kernels/ops_fp16.inc"

}  // namespace loom::cpu
