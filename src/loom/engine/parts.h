// The data-parallel parts of the engine (Note [Engine parts]): the gradient reduction and
// ZeRO-3's sharded parameters.
#pragma once

#include <functional>
#include <memory>

#include "loom/core/config.h"
#include "loom/core/memory.h"
#include "loom/engine/estimate.h"
#include "loom/engine/part.h"
#include "loom/model/model.h"
#include "loom/parallel/grad_sync.h"
#include "loom/parallel/zero.h"

namespace loom {

struct RankContext;

// dp's gradient reduction (Note [Sharded buckets]): the bucketed all-reduce or
// reduce-scatter as backward produces the gradients, with the codecs, compressors and
// Accordion the layout asks for.
class SyncPart final : public Part {
 public:
  SyncPart(const Config& cfg, const RankContext& rc, const parallel::DataParallelPlan& plan, Model& model,
           MemoryTracker& memory);
  parallel::GradSync& sync() { return *sync_; }
  // Note [Part memory estimates]: ZeRO-2/3's gradient pieces.
  static void estimate(const EstimateInputs& in, MemoryEstimate& e);
  // Per-micro-batch sharding: only the own pieces hold anything; the rest already reads zero.
  bool zero_gradients() override;
  void after_update(Reporter& rep, TrainSummary& sum) override;
  void report_run(Reporter& rep, TrainSummary& sum) override;
  // Note [Compressor state in checkpoints].
  void save_state(ShardState& s) const override;

 private:
  const Config& cfg_;
  const RankContext& rc_;
  const parallel::DataParallelPlan& plan_;
  Model& model_;
  std::unique_ptr<parallel::GradSync> sync_;
};

// ZeRO-3 with dp > 1 (Note [Sharded buckets]): the parameters stay sharded and each unit is
// gathered around its use.
class GatherPart final : public Part {
 public:
  GatherPart(const Config& cfg, const RankContext& rc, const parallel::DataParallelPlan& plan,
             const std::vector<int>& unit_bucket, Model& model, MemoryTracker& memory);
  parallel::ParamGather& gather() { return *gather_; }
  // Note [Part memory estimates]: the own pieces and the pool of units in flight.
  static void estimate(const EstimateInputs& in, MemoryEstimate& e);
  // Note [ZeRO-3 offload]: the own pieces packed elsewhere (the offload file's mapping).
  void set_packed_source(std::function<const float*()> packed) { packed_ = std::move(packed); }
  bool materialize_params() override;
  void report_memory(std::ostream& os, TrainSummary& sum) override;
  void report_run(Reporter& rep, TrainSummary& sum) override;

 private:
  std::unique_ptr<parallel::ParamGather> gather_;
  std::function<const float*()> packed_;
};

}  // namespace loom
