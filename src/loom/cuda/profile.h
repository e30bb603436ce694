// Note [CUDA profile]
// LOOM_CUDA_PROFILE=1 in the environment times the GPU's work by region: mark(name) records
// a CUDA event on the stream and the region `name` runs until the next mark; collect(),
// called where the host has synchronized with the stream, adds the elapsed times, and the
// time from there to the next mark is charged to "host" (the GPU waiting for launches).
// The table (ms per step, share; the first two steps, which also choose the GEMM
// algorithms, left out) goes to stderr at the end. Off, every call is a no-op.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::cuda {

class Profile {
 public:
  explicit Profile(cudaStream_t s);
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

  bool on() const { return on_; }
  void mark(const char* region) {
    if (on_) record(region);
  }
  void collect(int64_t steps_done = 0);

 private:
  void record(const char* region);
  bool on_ = false;
  cudaStream_t s_;
  std::vector<std::pair<const char*, cudaEvent_t>> pending_;
  std::vector<cudaEvent_t> free_;
  std::map<std::string, double> ms_;
  static constexpr int64_t kWarmupSteps = 2;  // not counted
  int64_t seen_ = 0, steps_ = 0;
};

}  // namespace loom::cuda
