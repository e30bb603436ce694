#include "loom/engine/parts.h"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "loom/ckpt/shard_ckpt.h"
#include "loom/train/rank_context.h"
#include "loom/train/report.h"
#include "loom/train/train_options.h"

namespace loom {

namespace {

parallel::GradSync::Mode sync_mode(const RankContext& rc) {
  switch (rc.plan->duties.grad) {
    case rank::GradPath::kReduceScatter: return parallel::GradSync::Mode::kReduceScatter;
    case rank::GradPath::kShardEveryMicro: return parallel::GradSync::Mode::kShardEveryMicro;
    default: return parallel::GradSync::Mode::kAllReduce;
  }
}

// Per ZeRO-3 unit (block l = l, embedding = layers, head = layers + 1): keep gathered?
std::vector<bool> zero_keep_units(const Config& cfg) {
  std::vector<bool> keep = cfg.parallel.zero_keep_layers(cfg.model.layers);
  keep.resize(size_t(cfg.model.layers + 2), false);
  return keep;
}

}  // namespace

SyncPart::SyncPart(const Config& cfg, const RankContext& rc, const parallel::DataParallelPlan& plan, Model& model,
                   MemoryTracker& memory)
    : cfg_(cfg), rc_(rc), plan_(plan), model_(model) {
  const parallel::CompressSpec& compress = rc.plan->compress;
  sync_ = std::make_unique<parallel::GradSync>(*rc.dp, plan, sync_mode(rc), parallel::ring_codec(compress));
  parallel::GradSync* const sync = sync_.get();
  sync->set_compressors(compress, model.layout().specs());
  sync->set_qgz(cfg.parallel.zeropp_qgz);
  sync->hold_first_tensor(rc.embed != nullptr);
  sync->keep_unowned(rc.zero == 1);
  sync->set_tracker(&memory);
  sync->measure_standalone();
  model.set_grad_ready_hook([sync](int first_final) { sync->on_ready(first_final); });
  if (plan.tied_first) {
    const int64_t C = cfg.model.d_model;
    model.set_tied_embedding_hooks({[sync] { sync->on_tied_head_done(); },
                                    [sync, C](const int32_t* tokens, const float* rows, int64_t n) {
                                      return sync->on_embedding_rows(tokens, rows, n, C);
                                    }});
  }
  if (sync->every_micro())  // only own pieces get written
    release_pages(model.grads().data(), int64_t(model.grads().size() * sizeof(float)));
}

bool SyncPart::zero_gradients() {
  if (!sync_->every_micro()) return false;
  for (const FlatRange& r : plan_.owned(rc_.dp_rank))
    std::memset(model_.grads().data() + r.offset, 0, size_t(r.count) * sizeof(float));
  return true;
}

// Note [Accordion]: its switches are logged.
void SyncPart::after_update(Reporter& rep, TrainSummary& sum) {
  for (std::string& line : sync_->take_accordion_log()) {
    rep.info(line);
    sum.accordion_log.push_back(std::move(line));
  }
}

// The reduction's overlap with backward (data parallel) and its bytes on the wire.
void SyncPart::report_run(Reporter& rep, TrainSummary& sum) {
  parallel::GradSync& s = *sync_;
  sum.comm_hidden_fraction = s.hidden_fraction();
  sum.comm_exposed_s = s.exposed_wait_s();
  std::ostringstream os;
  os << "data parallel: " << plan_.buckets.size() << " gradient buckets, reduced alone in " << std::fixed
     << std::setprecision(2) << s.standalone_s() * 1e3 << " ms per step; " << std::setprecision(1)
     << 100.0 * sum.comm_hidden_fraction << "% of it hidden behind backward (" << std::setprecision(3)
     << sum.comm_exposed_s << " s of reduction after the last rank's backward, all steps)";
  sum.comm_wire_bytes = s.mean_wire_bytes();
  sum.comm_exact_wire_bytes = s.exact_wire_bytes();
  os << "\n  gradients on the wire: " << std::setprecision(3) << sum.comm_wire_bytes / 1e6 << " MB per step from each rank ("
     << std::setprecision(1) << sum.comm_exact_wire_bytes / std::max(1.0, sum.comm_wire_bytes)
     << "x fewer than exact fp32)";
  rep.info(os.str());
}

// Note [Compressor state in checkpoints]: valid for the same compressor, parameters, layout
// and buckets (the bucket plan is a function of the layout and the cap).
void SyncPart::save_state(ShardState& s) const {
  const auto& compressors = sync_->compressors();
  parallel::Accordion* accordion = sync_->accordion();
  for (size_t b = 0; b < compressors.size(); b++) {
    std::vector<parallel::CompressorState> all = compressors[b]->state();
    if (accordion)
      for (const parallel::CompressorState& c : accordion->state(b)) all.push_back(c);
    for (const parallel::CompressorState& c : all) s.compressor.push_back({"bucket " + std::to_string(b) + " " + c.name, c.data});
  }
  const ParallelConfig& p = cfg_.parallel;
  std::ostringstream sig;
  sig << compress_name(p.compress) << " ratio " << p.compress_ratio << " momentum " << p.compress_momentum << " rank "
      << p.compress_rank;
  if (accordion)
    sig << " accordion window " << p.accordion_window << " eta " << p.accordion_eta << " heavy rank "
        << p.accordion_heavy_rank << " ratio " << p.accordion_heavy_ratio;
  sig << "; " << layout_text(p) << "; bucket_mb " << p.bucket_mb << ", " << plan_.buckets.size() << " buckets";
  s.compressor_signature = sig.str();
}

GatherPart::GatherPart(const Config& cfg, const RankContext& rc, const parallel::DataParallelPlan& plan,
                       const std::vector<int>& unit_bucket, Model& model, MemoryTracker& memory) {
  gather_ = std::make_unique<parallel::ParamGather>(
      *rc.dp, plan, unit_bucket, model.params().data(),
      [&model](int unit, float* base) { model.bind_unit_params(unit, base); }, &memory, zero_keep_units(cfg),
      cfg.comm.param_dtype == FloatFormat::kBf16 ? comm::Compression::kBF16
      : cfg.parallel.zeropp_qwz                  ? comm::Compression::kInt8
                                                 : comm::Compression::kNone,
      rc.dp_node.get());
  parallel::ParamGather* const g = gather_.get();
  model.set_param_hook([g](int unit, bool acquire) {
    if (acquire) g->acquire(unit);
    else g->release(unit);
  });
}

bool GatherPart::materialize_params() {
  gather_->gather_all(packed_ ? packed_() : nullptr);  // Note [ZeRO-3 offload]
  return true;
}

void GatherPart::report_memory(std::ostream& os, TrainSummary&) {
  os << " (+ gathered units: " << gather_->peak_units() << " at once, pool of "
     << double(gather_->pool_bytes()) / (1 << 20) << " MiB)";
}

void GatherPart::report_run(Reporter& rep, TrainSummary& sum) {
  sum.param_gathers = gather_->dp_gathers(), sum.param_gathers_on_host = gather_->host_gathers();
  if (sum.param_gathers_on_host > 0)
    rep.info("ZeRO++ hpZ: " + std::to_string(sum.param_gathers_on_host) + " of " +
             std::to_string(sum.param_gathers + sum.param_gathers_on_host) +
             " parameter gathers stayed on the host (secondary pieces)");
}

void SyncPart::estimate(const EstimateInputs& in, MemoryEstimate& e) {
  // Note [Compressed ZeRO-2/3]: a stateful compressor or Adasum keeps the step's gradient whole.
  // ZeRO-2 and 3 (both reduce-scatter every micro-batch): the own pieces, and the others'
  // share of the gradients not yet reduced (Note [Unreduced gradients]; ZeRO-3's counted
  // only the own pieces before, 6-9 MiB under the measured peak in six rows).
  if (in.zero >= 2 && !in.cfg.parallel.reduces_whole_buckets()) {
    e.grads = in.param_bytes() / in.shards();
    const int64_t unreduced = in.unreduced_floats > 0 ? in.unreduced_floats * int64_t(sizeof(float)) : in.param_bytes();
    if (in.shards() > 1)
      e.grads += std::min(in.param_bytes(), unreduced) * (in.shards() - 1) / in.shards();
  }
}

void GatherPart::estimate(const EstimateInputs& in, MemoryEstimate& e) {
  if (in.zero < 3 || in.dp <= 1) return;
  e.gather_pool = std::min(in.param_bytes(), in.units_in_flight * int64_t(sizeof(float)));
  e.params = in.param_bytes() / in.shards() + e.gather_pool;
}

}  // namespace loom
