#include "loom/kernels/profile.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "loom/core/error.h"
#include "loom/kernels/kernels.h"

namespace loom {

// Note [Kernel profile]
// The simulator prices a step as the sum of its kernels (Note [Cost model]); when it and the
// engine disagree, the question is which kernel the calibration got wrong. With
// LOOM_KERNEL_PROFILE=1 every kernel call goes through a wrapper that adds its wall time
// (steady clock, around the call; a kernel's own OpenMP threads are inside it) and a call
// count to the kernel's slot, and the process prints the table to stderr at exit. The
// wrappers are templates over the kernel's index in LOOM_KERNEL_LIST and its pointer type,
// so each keeps the real pointer of the table it wraps; one table per process is timed.
// Off (the default) kernels() returns the plain tables and nothing is timed.

namespace {

#define LOOM_KERNEL_ID(name) k_##name,
enum KernelId { LOOM_KERNEL_LIST(LOOM_KERNEL_ID) k_matmul_forward_bf16_in, k_matmul_backward_bf16_in, k_to_bf16,
                k_attention_forward_bf16, k_attention_backward_bf16, k_layernorm_backward_from_out,
                k_rmsnorm_backward_from_out, k_gelu_backward_bf16_in, k_swiglu_backward_bf16_in, k_adamw_update_bf16_moments,
                k_cp_attention_forward_bf16, k_cp_attention_backward_bf16, kKernelCount };
#undef LOOM_KERNEL_ID

struct Slot {
  std::atomic<int64_t> ns{0}, calls{0};
};
std::array<Slot, kKernelCount> slots;
std::array<const char*, kKernelCount> names;

template <int I, typename F>
struct Timed;
template <int I, typename R, typename... A>
struct Timed<I, R (*)(A...)> {
  static inline R (*real)(A...) = nullptr;
  static R call(A... a) {
    struct Stop {
      std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
      ~Stop() {
        slots[I].ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
        slots[I].calls += 1;
      }
    } stop;
    return real(a...);
  }
};

template <int I, typename F>
void wrap(F& field, const char* name) {
  if (!field) return;
  // The slot holds one real pointer: a second, different table would silently redirect the
  // first one's calls to its kernels.
  const F held = Timed<I, F>::real;
  LOOM_CHECK(!held || held == field, "LOOM_KERNEL_PROFILE times one kernel table per process; ", name,
             " is already wrapped for another table");
  names[I] = name;
  Timed<I, F>::real = field;
  field = &Timed<I, F>::call;
}

void print_at_exit() { std::fputs(kernel_profile_text().c_str(), stderr); }

}  // namespace

bool kernel_profile_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_KERNEL_PROFILE");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

Kernels profiled_kernels(const Kernels& k) {
  Kernels p = k;
#define LOOM_KERNEL_WRAP(name) wrap<k_##name>(p.name, #name);
  LOOM_KERNEL_LIST(LOOM_KERNEL_WRAP)
#undef LOOM_KERNEL_WRAP
  wrap<k_matmul_forward_bf16_in>(p.matmul_forward_bf16_in, "matmul_forward_bf16_in");
  wrap<k_matmul_backward_bf16_in>(p.matmul_backward_bf16_in, "matmul_backward_bf16_in");
  wrap<k_to_bf16>(p.to_bf16, "to_bf16");
  wrap<k_attention_forward_bf16>(p.attention_forward_bf16, "attention_forward_bf16");
  wrap<k_attention_backward_bf16>(p.attention_backward_bf16, "attention_backward_bf16");
  wrap<k_layernorm_backward_from_out>(p.layernorm_backward_from_out, "layernorm_backward_from_out");
  wrap<k_rmsnorm_backward_from_out>(p.rmsnorm_backward_from_out, "rmsnorm_backward_from_out");
  wrap<k_gelu_backward_bf16_in>(p.gelu_backward_bf16_in, "gelu_backward_bf16_in");
  wrap<k_swiglu_backward_bf16_in>(p.swiglu_backward_bf16_in, "swiglu_backward_bf16_in");
  wrap<k_adamw_update_bf16_moments>(p.adamw_update_bf16_moments, "adamw_update_bf16_moments");
  wrap<k_cp_attention_forward_bf16>(p.cp_attention_forward_bf16, "cp_attention_forward_bf16");
  wrap<k_cp_attention_backward_bf16>(p.cp_attention_backward_bf16, "cp_attention_backward_bf16");
  if (kernel_profile_enabled()) {
    static const bool registered = std::atexit(print_at_exit) == 0;
    (void)registered;
  }
  return p;
}

std::vector<KernelTime> kernel_profile() {
  std::vector<KernelTime> out;
  for (int i = 0; i < kKernelCount; ++i)
    if (const int64_t n = slots[size_t(i)].calls.load(); n > 0)
      out.push_back({names[size_t(i)], n, double(slots[size_t(i)].ns.load()) * 1e-9});
  std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) { return a.seconds > b.seconds; });
  return out;
}

std::string kernel_profile_text() {
  std::ostringstream os;
  // Under mpirun every rank prints its own, in no set order: the launcher's rank names it.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  os << "kernel profile (LOOM_KERNEL_PROFILE" << (rank ? std::string(", rank ") + rank : std::string())
     << "): kernel, calls, total ms, us per call\n";
  for (const KernelTime& t : kernel_profile()) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-28s %8lld %12.3f %12.2f\n", t.name.c_str(), static_cast<long long>(t.calls),
                  t.seconds * 1e3, t.seconds * 1e6 / double(t.calls));
    os << line;
  }
  return os.str();
}

}  // namespace loom
