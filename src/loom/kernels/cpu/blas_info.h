// What the GEMM backend is doing on this CPU.
#pragma once
#include <string>

namespace loom::cpu {

// OpenBLAS's kernel family in use (e.g. "SkylakeX", "Haswell") and its configuration.
std::string blas_core_name();
std::string blas_config();

// Non-empty when the BLAS kernels use a narrower instruction set than this CPU offers
// (e.g. OPENBLAS_CORETYPE=Haswell on an AVX-512 machine): a message naming the fix.
std::string blas_downgrade_warning();

}  // namespace loom::cpu
