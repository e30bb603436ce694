// Note [Machine speed]: one fixed timing that says how fast this machine runs now, recorded by
// `loom calibrate` (device.speed_probe_gflops) and repeated by bench/sim_vs_engine before each
// pass, so a benchmark run can say how fast the machine ran against the calibration it is
// scored on. This VM's speed drifts by 10-25% over minutes (other tenants); a run in a slow
// spell measures every layout slower than calibrated, which is the machine, not the model.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "loom/kernels/kernels.h"
#include "loom/sim/calibrate.h"

extern "C" void openblas_set_num_threads(int);

namespace loom {

// loom's fp32 linear layer, (2048 x 768) x (768 x 768) on hot operands, on `threads` threads:
// the median rate of the repetitions filling ~0.3 s, in FLOP/s. OpenMP and OpenBLAS are left
// at `threads`.
double speed_probe_flops(int threads) {
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  const Kernels& k = kernels(KernelBackend::kCpu, Precision::kFp32);
  constexpr int64_t N = 2048, C = 768;
  std::vector<float> x(size_t(N * C), 0.5f), w(size_t(C * C), 0.25f), y(size_t(N * C));
  using Clock = std::chrono::steady_clock;
  k.matmul_forward(y.data(), x.data(), w.data(), nullptr, N, C, C);  // warm: pages, BLAS buffers
  std::vector<double> s;
  const Clock::time_point start = Clock::now();
  while (s.size() < 5 || (std::chrono::duration<double>(Clock::now() - start).count() < 0.3 && s.size() < 200)) {
    const Clock::time_point t0 = Clock::now();
    k.matmul_forward(y.data(), x.data(), w.data(), nullptr, N, C, C);
    s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return 2.0 * double(N) * double(C) * double(C) / s[s.size() / 2];
}

}  // namespace loom
