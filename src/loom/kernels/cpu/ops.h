// Fast CPU kernels: OpenBLAS GEMM, OpenMP, vectorised loops. Same contracts as loom::ref.
#pragma once
#include <cstdint>
namespace loom::cpu {
#include "loom/kernels/ops.inc"
}  // namespace loom::cpu
