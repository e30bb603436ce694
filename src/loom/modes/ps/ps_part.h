// A parameter-server worker's part of the engine (Note [Engine parts], Note [Parameter
// server] in modes/ps/ps.h): its pushes and pulls, the embedding rows it asks for (Note
// [Sparse embeddings]) and the servers' figures at the run's end.
#pragma once

#include <memory>

#include "loom/core/config.h"
#include "loom/engine/estimate.h"
#include "loom/engine/part.h"
#include "loom/modes/ps/ps.h"

namespace loom {

struct RankContext;
class Model;

class PsPart final : public Part {
 public:
  PsPart(const Config& cfg, const RankContext& rc, const Model& model, int64_t mb, int64_t T);
  parallel::PsWorker& worker() { return *ps_; }
  // Note [Part memory estimates]: the servers hold the optimizer state, a worker none.
  static void estimate(const EstimateInputs& in, MemoryEstimate& e);
  void before_pass(const DataLoader& data, int64_t step) override;
  void after_resume(int64_t step) override { ps_->start_at(step); }
  void end_run(Reporter& rep, TrainSummary& sum, int64_t& real_tokens) override;

 private:
  const Config& cfg_;
  const RankContext& rc_;
  int64_t mb_, T_;
  std::unique_ptr<parallel::PsWorker> ps_;
};

}  // namespace loom
