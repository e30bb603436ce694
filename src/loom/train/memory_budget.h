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
#include <functional>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/memory.h"
#include "loom/engine/estimate.h"

namespace loom {

struct RankContext;
namespace comm {
class Group;
}

// Collective over everyone(rc). Throws ConfigError on every rank when a rank's estimate does
// not fit memory.limit_gib (or, without a budget, its machine's memory), naming the categories
// and the settings that would shrink them, or when the ranks of one host together need more
// than it has available (Note [Host memory preflight]). `host_memory` (tests) replaces
// host_available_bytes().
void check_fits(const Config& cfg, const RankContext& rc, int64_t mb, int64_t T,
                const std::function<int64_t()>& host_memory = {});

// Note [Host memory preflight]
// check_fits bounds each rank's estimate by memory.limit_gib or by its machine, but the ranks
// of one host share that machine: eight ranks of 3 GiB do not fit a host of 16 GiB although
// each does alone, and the job would swap or be killed by the kernel mid-run. So before
// anything is allocated each rank states its estimate (parameters, gradients, optimizer state,
// activations: Note [Part memory estimates]) and what its host has available, in one
// all-gather; every rank then sums the estimates of each host's ranks and, where a sum exceeds
// the least that host's ranks read, refuses with the same message naming the host, its ranks
// and their needs. Available is MemAvailable of /proc/meminfo (what can be allocated without
// swapping), bounded by the limit of the process's cgroup (a container's or a Slurm job's).
struct RankMemory {
  int64_t need = 0;       // this rank's estimate, bytes
  int64_t available = 0;  // its host's available memory as this rank read it, bytes (0: unknown)
  int rank = 0;           // its global rank, to name it
};
// The refusal for ranks[i] on hosts[i] (empty: every host holds its ranks).
std::string host_memory_problem(const std::vector<RankMemory>& ranks, const std::vector<std::string>& hosts);
// This host's available memory in bytes (0: unknown).
int64_t host_available_bytes();

// The same checks for every rank of cfg's layout before any runs it (the elastic supervisor's
// re-plan, Note [Elastic shapes]): each rank's estimate from its plan (plan_rank), against
// memory.limit_gib (or this machine's memory), and the ranks placed on `host_of_rank` (rank
// order; a layout of more ranks: "?") summed per host against `host_available` bytes each (0:
// unchecked). Empty when it fits, else the refusal check_fits would give.
std::string layout_memory_problem(const Config& cfg, const std::vector<std::string>& host_of_rank,
                                  int64_t host_available);
// Rank `global_rank` of cfg's layout's estimate in bytes (what check_fits states for it).
int64_t rank_need_bytes(const Config& cfg, int global_rank);

// After a step, with memory.limit_gib set: collective over `group` (nullptr: one process).
// Throws Error on every rank when any rank's measured peak exceeded the budget.
void check_budget(const Config& cfg, const MemoryTracker& memory, comm::Group* group, int group_rank);

// "1.50 GiB" / "640 MiB".
std::string bytes_text(int64_t bytes);

}  // namespace loom
