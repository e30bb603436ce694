#include "loom/core/omp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace loom {

bool wants_passive_reexec(const char* omp_wait_policy, const char* gomp_spincount) {
  return omp_wait_policy == nullptr && gomp_spincount == nullptr;
}

void reexec_for_passive_omp_wait(char** argv) {
  if (!wants_passive_reexec(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"))) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // returns only on failure: go on as we are
}

std::string omp_wait_summary() {
  if (const char* p = std::getenv("OMP_WAIT_POLICY")) return std::string("OMP_WAIT_POLICY=") + p;
  if (const char* s = std::getenv("GOMP_SPINCOUNT")) return std::string("GOMP_SPINCOUNT=") + s;
  return "libgomp's default wait";
}

}  // namespace loom
