#include "loom/kernels/cpu/blas_info.h"

#include <cblas.h>

#include <cstdlib>

namespace loom::cpu {

std::string blas_core_name() { return openblas_get_corename(); }
std::string blas_config() { return openblas_get_config(); }

std::string blas_downgrade_warning() {
  const std::string core = blas_core_name();
  // OpenBLAS's AVX-512 x86 kernel families.
  const bool core_avx512 = core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids" ||
                           core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  __builtin_cpu_init();
  const bool cpu_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!cpu_avx512 || core_avx512) return {};
  std::string msg = "GEMM runs OpenBLAS '" + core + "' kernels but this CPU supports AVX-512";
  if (const char* env = std::getenv("OPENBLAS_CORETYPE"))
    msg += " (OPENBLAS_CORETYPE=" + std::string(env) + " forces it; unset OPENBLAS_CORETYPE for ~2x GEMM speed)";
  else
    msg += " (this OpenBLAS build lacks AVX-512 kernels; GEMM may run at about half speed)";
  return msg;
}

}  // namespace loom::cpu
