// One rank's place in a parallel run: its groups, its model part and its schedule.
// Mesh axes, outermost first: pp, dp, tp (Note [Global batch] in core/config.h).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "loom/comm/group.h"
#include "loom/core/config.h"
#include "loom/model/layout.h"
#include "loom/model/tp_comm.h"
#include "loom/parallel/pipeline.h"
#include "loom/parallel/schedule.h"
#include "loom/parallel/rank_plan.h"

namespace loom {

struct RankContext {
  comm::World* world = nullptr;  // null: single process, no groups
  int dp_rank = 0, dp_size = 1, pp_rank = 0, pp_size = 1, tp_rank = 0, tp_size = 1, zero = 0;
  bool logging = true;                   // global rank 0 writes the log
  std::unique_ptr<comm::Group> dp;       // null when dp == 1
  std::unique_ptr<comm::Group> dp_node;  // ZeRO++ hpZ: this dp group's ranks on this host (Note [hpZ])
  std::unique_ptr<comm::Group> tp;       // null when tp == 1
  std::unique_ptr<TpComm> tp_comm;       // the model's view of `tp`
  std::unique_ptr<comm::Group> vocab;    // parallel.pp_vocab: a pipeline's ranks x tp (Note [Vocabulary passes])
  std::unique_ptr<TpComm> vocab_comm;    // the model's view of `vocab`
  // Context parallelism (Note [Context-parallel chunks]): `dp` above holds dp x cp ranks, this
  // rank's cp group is its replica's cp ranks (null when cp == 1), and the data a rank reads
  // is its replica's: data_rank() of data_size().
  int cp_rank = 0, cp_size = 1;
  std::unique_ptr<comm::Group> cp;
  std::unique_ptr<TpComm> cp_comm;  // the model's view of `cp` (all-gather / reduce-scatter of blocks)
  int data_rank() const { return dp_rank / cp_size; }
  int data_size() const { return dp_size / cp_size; }
  std::unique_ptr<comm::Group> stats;    // every rank (pp x dp x tp): loss and norm sums; null single-process
  std::unique_ptr<comm::Group> embed;    // GPT pipelines: first and last stage (tied wte)
  // pipedream / pipemare GPT pipelines: the same pair, for the first stage's sends (embed
  // carries the last stage's; Note [PipeDream weight stashing]).
  std::unique_ptr<comm::Group> tied_down;
  parallel::PipeLinks links;
  // Note [Parameter server]: a PS worker's link to its shard's servers (parallel::ps_groups);
  // null otherwise. Under ps.mode = sync `stats` is the workers' group; under async / ssp the
  // workers never meet per step: `stats` is null and ps_workers holds that group.
  // ps_replica: the tp x pp ranks of this worker's dp replica (Note [Parameter server with
  // model parallelism]); null when tp = pp = 1.
  std::unique_ptr<comm::Group> ps, ps_workers, ps_replica;
  std::shared_ptr<const RankPlan> plan;  // Note [Rank plan]: what this rank holds and does
  ModelPart part;                        // plan->part
  std::optional<parallel::Schedule> schedule;  // plan->schedule (pp > 1)
  int act_slots = 1;                     // plan->act_slots

  // Sums over the stats group (identity without one).
  void stats_sum(std::span<double> x) const;
  // The head part of a GPT pipeline holds a copy of wte that is not its own to count.
  bool holds_tied_copy(const ModelConfig& m) const { return part.holds_tied_copy(m); }
  // Replicated tensors are counted (norm, whole-model assembly) by tp rank 0 only.
  // (pp_vocab's vocabulary rows are split over tp only where the vocabulary is.)
  bool counts(const ParamSpec& s, const ModelConfig& m) const {
    const bool split_over_tp = s.vocab_parts > 0 ? s.vocab_parts > part.vocab_pp : s.split_dim >= 0;
    return !(s.name == "wte" && holds_tied_copy(m)) && (split_over_tp || tp_rank == 0);
  }
};

// Every rank that trains: the world, or a parameter-server job's workers (Note [Parameter
// server]); null single-process. Run-wide agreements (outputs, budgets) are collective over it.
comm::Group* everyone(const RankContext& rc);

// Builds the groups (collective over the world: every rank makes the same calls).
RankContext make_rank_context(const Config& cfg, comm::World* world);

// The whole model's flat buffer (whole-model layout, ParamLayout(cfg.model)) assembled on
// every rank from each rank's `flat` over layout `mine`: dp rank 0 of every stage
// contributes what it holds (a tied wte copy is left to the first stage, replicated
// tensors to tp rank 0, split ones as slices), then one all-reduce over the stats group
// (a PS job: over all its workers).
std::vector<float> gather_whole(const ModelConfig& m, const ParamLayout& mine, const float* flat,
                                const RankContext& rc);

}  // namespace loom
