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
#include "loom/engine/estimate.h"

namespace loom {

struct RankContext;
namespace comm {
class Group;
}

// Throws ConfigError when the estimate does not fit memory.limit_gib (or, without a budget,
// this machine's memory), naming the categories and the settings that would shrink them.
void check_fits(const Config& cfg, const RankContext& rc, int64_t mb, int64_t T);

// After a step, with memory.limit_gib set: collective over `group` (nullptr: one process).
// Throws Error on every rank when any rank's measured peak exceeded the budget.
void check_budget(const Config& cfg, const MemoryTracker& memory, comm::Group* group, int group_rank);

// "1.50 GiB" / "640 MiB".
std::string bytes_text(int64_t bytes);

}  // namespace loom
