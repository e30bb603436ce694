#include "loom/kernels/kernels.h"

namespace loom {

const Kernels& kernels(KernelBackend backend) {
#define LOOM_KERNEL_CPU(name) &cpu::name,
#define LOOM_KERNEL_REF(name) &ref::name,
  static const Kernels cpu_set{LOOM_KERNEL_LIST(LOOM_KERNEL_CPU) "cpu"};
  static const Kernels ref_set{LOOM_KERNEL_LIST(LOOM_KERNEL_REF) "ref"};
#undef LOOM_KERNEL_CPU
#undef LOOM_KERNEL_REF
  return backend == KernelBackend::kCpu ? cpu_set : ref_set;
}

}  // namespace loom
