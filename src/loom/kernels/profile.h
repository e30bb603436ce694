// Per-kernel wall time of a run (Note [Kernel profile]): LOOM_KERNEL_PROFILE=1 makes
// kernels() hand out a table whose entries time the real kernels, and the process prints
// the totals when it exits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct Kernels;

struct KernelTime {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;
};

bool kernel_profile_enabled();  // LOOM_KERNEL_PROFILE set and not "0"
// A copy of `k` whose kernels (the table's and the bf16 extras it has) record their time;
// one timed table per process (the slots are per kernel, not per table). With the profile
// enabled, the table is printed to stderr at exit.
Kernels profiled_kernels(const Kernels& k);
// Every kernel called so far, longest total first.
std::vector<KernelTime> kernel_profile();
std::string kernel_profile_text();

}  // namespace loom
