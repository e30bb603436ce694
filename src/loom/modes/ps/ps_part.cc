#include "loom/modes/ps/ps_part.h"

#include "loom/model/model.h"
#include "loom/modes/ps/ps_server.h"
#include "loom/train/rank_context.h"

namespace loom {

PsPart::PsPart(const Config& cfg, const RankContext& rc, const Model& model, int64_t mb, int64_t T)
    : cfg_(cfg), rc_(rc), mb_(mb), T_(T) {
  ps_ = std::make_unique<parallel::PsWorker>(*rc.ps, rc.plan->ps_keys);
  // Note [Sparse embeddings]: the table's bytes are counted apart (row-sparse only with tp =
  // pp = 1); a middle pipeline stage holds none.
  if (const ParamSpec* wte = model.layout().find("wte"))
    ps_->set_table({wte->offset, wte->shape[0], wte->shape[1]}, cfg.ps.sparse_embedding);
}

void PsPart::estimate(const EstimateInputs& in, MemoryEstimate& e) {
  if (in.cfg.parallel.ps_servers > 0) e.moment_floats = 0, e.optimizer_in_memory = 0, e.optimizer = 0;
}

void PsPart::before_pass(const DataLoader& data, int64_t step) {
  if (ps_->sparse()) choose_ps_rows(cfg_, data, *ps_, step, mb_, T_);  // Note [Sparse embeddings]
}

void PsPart::end_run(Reporter& rep, TrainSummary& sum, int64_t& real_tokens) {
  finish_ps_worker(cfg_, rc_, *ps_, rep, sum, real_tokens);
}

}  // namespace loom
