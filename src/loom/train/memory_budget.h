// Per-rank memory: the estimate before allocating, and the budget while training.
//
// Note [Memory budget]
// memory.limit_gib bounds loom's resident state on each rank: parameters, gradients,
// optimizer state, activations and buffers (Note [Resident memory]: pages counted with
// mincore, not formulas). Before anything is allocated, the layout's need is estimated per
// category (the ZeRO split of the model states, the offload buffers in place of offloaded
// state, the model's own activation carve) and a layout over the budget (or, without one,
// over the machine's memory) is refused, naming each category and what would bring it
// down. While training, the tracker's total at every sample is compared with the budget
// after each step on every rank, with one agreement, so a run whose measured state grows
// past it stops on every rank at once, naming the categories, before its next checkpoint
// could be written from a state the user did not budget for (the last one stays intact).
#pragma once

#include <cstdint>
#include <string>

#include "loom/core/config.h"
#include "loom/core/memory.h"

namespace loom {

struct RankContext;
namespace comm {
class Group;
}

// Bytes this rank's layout needs per category before buffers (those are measured only).
struct MemoryEstimate {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  int64_t optimizer_in_memory = 0;  // what the optimizer state would take without offload
  int64_t moment_floats = 0;        // floats of each moment on this rank
  int64_t params_offloaded = 0;     // what the parameters would take with offload.params = disk
  int64_t total() const { return params + grads + optimizer + activations; }
};

// The estimate for `params` parameters on this rank; activations: the model's carve;
// units_in_flight: the floats of its three largest units (parameter offload holds at least
// the unit in use, the one read ahead and GPT's tied embedding); pp_rank: its pipeline rank
// (the streams' weight versions differ by stage).
MemoryEstimate estimate_memory(const Config& cfg, int zero, int dp, int64_t params, int64_t activation_bytes,
                               int64_t units_in_flight, int pp_rank);

// Throws ConfigError when the estimate does not fit memory.limit_gib (or, without a budget,
// this machine's memory), naming the categories and the settings that would shrink them.
void check_fits(const Config& cfg, const RankContext& rc, int64_t mb, int64_t T);

// After a step, with memory.limit_gib set: collective over `group` (nullptr: one process).
// Throws Error on every rank when any rank's measured peak exceeded the budget.
void check_budget(const Config& cfg, const MemoryTracker& memory, comm::Group* group, int group_rank);

// "1.50 GiB" / "640 MiB".
std::string bytes_text(int64_t bytes);

}  // namespace loom
