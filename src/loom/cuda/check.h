// CUDA error checks: a failed runtime call or launch throws loom::Error naming the call,
// the CUDA error and file:line (an out-of-memory is a configuration problem the user can
// fix, so it is not an abort).
#pragma once

#include <cuda_runtime_api.h>

namespace loom::cuda {

void check(cudaError_t e, const char* what, const char* file, int line);
// The last launch's error (cudaGetLastError).
void check_launch(const char* kernel, const char* file, int line);

}  // namespace loom::cuda

#define LOOM_CUDA_OK(expr) ::loom::cuda::check((expr), #expr, __FILE__, __LINE__)
#define LOOM_CUDA_LAUNCHED(name) ::loom::cuda::check_launch(name, __FILE__, __LINE__)
