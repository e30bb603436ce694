#include "loom/cuda/profile.h"

#include <cstdio>
#include <cstdlib>

#include "loom/cuda/check.h"

namespace loom::cuda {

Profile::Profile(cudaStream_t s) : s_(s) {
  const char* env = std::getenv("LOOM_CUDA_PROFILE");
  on_ = env && *env && std::string(env) != "0";
}

void Profile::record(const char* region) {
  cudaEvent_t e;
  if (free_.empty()) {
    LOOM_CUDA_OK(cudaEventCreate(&e));
  } else {
    e = free_.back();
    free_.pop_back();
  }
  LOOM_CUDA_OK(cudaEventRecord(e, s_));
  pending_.emplace_back(region, e);
}

void Profile::collect(int64_t steps_done) {
  if (!on_) return;
  record("host");
  LOOM_CUDA_OK(cudaEventSynchronize(pending_.back().second));
  const bool warm = seen_ >= kWarmupSteps;  // the first steps also tune the GEMMs
  for (size_t i = 0; i + 1 < pending_.size(); i++) {
    float ms = 0;
    LOOM_CUDA_OK(cudaEventElapsedTime(&ms, pending_[i].second, pending_[i + 1].second));
    if (warm) ms_[pending_[i].first] += ms;
    free_.push_back(pending_[i].second);
  }
  pending_.erase(pending_.begin(), pending_.end() - 1);  // "host" runs to the next mark
  seen_ += steps_done;
  if (warm) steps_ += steps_done;
}

Profile::~Profile() {
  if (!on_) return;
  double total = 0;
  for (const auto& [name, ms] : ms_) total += ms;
  const double steps = double(steps_ > 0 ? steps_ : 1);
  std::fprintf(stderr, "cuda profile: %lld steps, %.2f ms per step\n", static_cast<long long>(steps_), total / steps);
  for (const auto& [name, ms] : ms_)
    std::fprintf(stderr, "  %-16s %9.3f ms/step %6.1f%%\n", name.c_str(), ms / steps, 100.0 * ms / total);
  for (auto& [name, e] : pending_) cudaEventDestroy(e);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

}  // namespace loom::cuda
