// What a published row left unstated about recompute, fitted to its GPUs' memory
// (Note [Unstated recompute]).
#include <algorithm>
#include <functional>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"
#include "loom/sim/published.h"

namespace loom::sim {

// Note [Unstated recompute]
// A row that leaves its recompute unstated is read as none, but a run that ran fit in its
// GPUs' memory: where the row's sharding is known (ZeRO-2/3 and FSDP stated; ZeRO-1 implied by
// --overlap-param-gather, Note [Unstated Megatron flags], or by NVIDIA's recipes, Note [NVIDIA
// recipes]), recompute is the remaining lever, and the least recompute whose predicted peak
// fits the device is taken (none, selective, full; none again if nothing fits) and said. A
// Megatron stack also recomputes by the block (--recompute-method block --recompute-num-layers
// N: the first N layers of every virtual stage whole, the others kept; NVIDIA's recipes set it
// where all or nothing would not pay), so its rows take the least N that fits between
// selective and full; NVIDIA's Grace-Blackwell recipe rows at pp 1 first try the least layers
// offloaded to the host (Note [Activation offload], Note [NVIDIA recipes]). Rows that name no
// sharding may have fit by an unstated distributed optimizer instead, so they keep none. MaxText's Llama 3 70B rows (FSDP over 256-1,024 H100s,
// 2 x 8,192 tokens a GPU) need 351 GiB without recompute.
namespace {
// Full recompute of the first `n` layers of each of the plan's virtual stages, none after.
std::vector<Recompute> block_recompute(const SimPlan& plan, int n) {
  const ModelConfig& m = plan.cfg.model;
  const ParallelConfig& p = plan.cfg.parallel;
  std::vector<Recompute> out;
  for (int count : parallel::stage_layers(int(m.layers), int(p.pp * p.vpp), p.layer_split(m.layers)))
    for (int i = 0; i < count; ++i) out.push_back(i < n ? Recompute::kFull : Recompute::kNone);
  return out;
}

// The least n in [1, most] for which `set(n)` makes the plan fit (the peak falls as n grows),
// by bisection; 0 if none does.
int64_t least_that_fits(PublishedCase& c, int64_t most, const std::function<void(int64_t)>& set) {
  int64_t lo = 1, hi = most + 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    set(mid);
    if (simulate(c.plan, c.cluster).peak_memory_bytes <= c.cluster.device.memory_bytes) hi = mid;
    else lo = mid + 1;
  }
  return lo <= most ? lo : 0;
}

// The least block count that fits (the peak falls as it grows), by bisection; 0 if only
// recomputing every layer fits, or nothing does.
int least_fitting_blocks(PublishedCase& c) {
  const ModelConfig& m = c.plan.cfg.model;
  const ParallelConfig& p = c.plan.cfg.parallel;
  const std::vector<int> stages = parallel::stage_layers(int(m.layers), int(p.pp * p.vpp), p.layer_split(m.layers));
  const int most = *std::max_element(stages.begin(), stages.end()) - 1;  // the largest stage keeps a layer
  return int(least_that_fits(c, most, [&](int64_t n) { c.plan.cfg.parallel.recompute = block_recompute(c.plan, int(n)); }));
}

// The least layer count whose activations offloaded make the plan fit; 0 if none short of
// every layer does (Note [Activation offload]).
int64_t least_fitting_offload(PublishedCase& c) {
  c.plan.cfg.parallel.recompute = {Recompute::kNone};
  const int64_t n = least_that_fits(c, c.plan.cfg.model.layers - 1, [&](int64_t k) { c.plan.activation_offload_layers = k; });
  c.plan.activation_offload_layers = n;
  return n;
}

}  // namespace

std::string fit_unstated_recompute(PublishedCase& c, bool blocks, bool offload) {
  const double device = c.cluster.device.memory_bytes;
  std::string tried;
  auto fits = [&](Recompute r, const char* name) {
    c.plan.cfg.parallel.recompute = {r};
    const double peak = simulate(c.plan, c.cluster).peak_memory_bytes;
    if (peak <= device) return true;
    tried += detail::cat(tried.empty() ? "" : ", ", name, " needs ", int64_t(peak / double(int64_t(1) << 30)), " GiB of ",
                         int64_t(device / double(int64_t(1) << 30)));
    return false;
  };
  if (fits(Recompute::kNone, "none")) return "";
  if (const int64_t n = offload ? least_fitting_offload(c) : 0; n > 0)
    return detail::cat("recompute unstated: none, the first ", n, " layers' activations offloaded to the host (", tried, ")");
  if (fits(Recompute::kSelective, "selective")) return detail::cat("recompute unstated: selective (", tried, ")");
  if (const int n = blocks ? least_fitting_blocks(c) : 0; n > 0) {
    c.plan.cfg.parallel.recompute = block_recompute(c.plan, n);
    return detail::cat("recompute unstated: full on the first ", n, " layers of each virtual stage (", tried, ")");
  }
  if (fits(Recompute::kFull, "full")) return detail::cat("recompute unstated: full (", tried, ")");
  c.plan.cfg.parallel.recompute = {Recompute::kNone};
  return detail::cat("recompute unstated: none, though nothing fits (", tried, ")");
}

}  // namespace loom::sim
