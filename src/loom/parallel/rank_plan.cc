// Note [Rank plan] (rank_plan.h).
#include "loom/parallel/rank_plan.h"

#include <algorithm>
#include <string>

#include "loom/comm/mesh.h"
#include "loom/core/error.h"
#include "loom/parallel/stage_part.h"
#include "loom/parallel/zero.h"
#include "loom/rank/cp_chunks.h"

namespace loom {

namespace {

// Note [Tied embedding reduction] applies to GPT's tied wte when one rank holds the whole
// vocabulary and both ends of the model and the gradients are reduced at the step's last
// micro-batch (all-reduced; under ZeRO-1 reduce-scattered).
bool tied_split(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  return cfg.model.arch == Arch::kGpt && p.dp_ranks() > 1 && p.tp == 1 && p.pp == 1 && p.zero <= 1;
}

parallel::WteBucket wte_bucket(const Config& cfg) {
  if (tied_split(cfg)) return parallel::WteBucket::kTiedFirst;
  const ParallelConfig& p = cfg.parallel;
  if (cfg.model.arch == Arch::kGpt && p.pp > 1 && p.dp_ranks() > 1 && p.reduces_whole_buckets())
    return parallel::WteBucket::kAloneLast;
  return parallel::WteBucket::kShared;
}

parallel::DataParallelPlan make_dp_plan(const Config& cfg, const ModelPart& part, std::vector<int>* unit_bucket) {
  const int dp = int(cfg.parallel.dp_ranks());  // the gradient group: dp x cp
  if (cfg.parallel.zero == 3) return parallel::plan_units(cfg.model, dp, part, unit_bucket);
  parallel::BucketCaps caps;
  caps.cap_bytes = std::max<int64_t>(4, int64_t(cfg.parallel.bucket_mb * double(1 << 20)));
  caps.first_cap_bytes = std::min(caps.first_cap_bytes, caps.cap_bytes);
  return parallel::plan_data_parallel(cfg.model, dp, caps, cfg.parallel.zero > 0, part, wte_bucket(cfg));
}

}  // namespace

RankPlan plan_rank(const Config& cfg, int global_rank) {
  const ParallelConfig& p = cfg.parallel;
  if (const std::string why = parallel::pp_vocab_refusal(cfg); !why.empty()) throw ConfigError(why);
  if (p.ps_servers > 0 && global_rank >= p.world()) {  // Note [Parameter server with model parallelism]
    const rank::PsPlace at = rank::ps_place(p, global_rank);
    RankPlan server = plan_rank(cfg, at.worker);
    server.global_rank = global_rank;
    server.dp_rank = int(p.dp) + at.index;  // a checkpoint's coordinates: the servers follow the workers
    server.moment_ranges = {server.ps_keys[size_t(at.index)]};
    server.param_ranges = server.moment_ranges;
    server.duties = rank::duties(cfg, global_rank);
    return server;
  }
  const std::vector<int> c = comm::training_mesh(p).coords(global_rank);
  const ModelPart part = parallel::rank_part(cfg, c[0], c[2]);
  std::optional<parallel::Schedule> schedule;
  int act_slots = 1, w_slots = 0;
  std::vector<int> chunk_peaks(size_t(p.vpp), 1);
  if (p.pp > 1) {
    schedule = parallel::make_schedule(p.schedule, int(p.pp), int(cfg.train.grad_accum), int(p.vpp), p.pp_vocab,
                                       parallel::stage_work(cfg, int(p.pp), int(p.vpp)),
                                       parallel::vocab_pass_work(cfg, int(p.pp)));
    const parallel::ScheduleCheck check = parallel::validate(*schedule);
    LOOM_CHECK(check.ok, "pipeline schedule ", schedule_name(p.schedule), " does not finish: ", check.problem);
    act_slots = check.peak_in_flight[size_t(c[0])];
    chunk_peaks = check.chunk_peak_in_flight[size_t(c[0])];
    w_slots = check.peak_pending_w[size_t(c[0])];
  }
  std::vector<Recompute> recompute;
  recompute = p.recompute_layers(cfg.model.layers);
  std::vector<int> unit_bucket;
  parallel::DataParallelPlan dp_plan = make_dp_plan(cfg, part, &unit_bucket);
  ParamLayout layout(cfg.model, p.dp_ranks() > 1 ? dp_plan.padding : LayoutPadding{}, part);
  const std::vector<FlatRange> all = {{0, layout.total_floats()}};
  const bool sharded = p.zero > 0 && p.dp_ranks() > 1;
  std::vector<FlatRange> moments = sharded ? dp_plan.owned(c[1]) : all;
  std::vector<FlatRange> params = p.zero == 3 && p.dp_ranks() > 1 ? moments : all;
  const rank::StateBytes bytes = rank::model_state_bytes(double(layout.param_count()), p.dp_ranks(), int(p.zero),
                                                         rank::engine_widths(cfg.optim));
  // unit_floats, ps_keys and cp_positions are filled below.
  RankPlan plan{global_rank, c[0], c[1], c[2], part, std::move(schedule), act_slots, std::move(chunk_peaks),
                std::move(recompute), std::move(dp_plan), std::move(unit_bucket), std::move(layout),
                std::move(params), std::move(moments), w_slots, rank::duties(cfg, global_rank), bytes,
                rank::compress_spec(cfg), {}, {}, {}};
  std::vector<int> whole_units;
  for (const parallel::Bucket& b : parallel::plan_units(cfg.model, 1, part, &whole_units).buckets)
    plan.unit_floats.push_back(b.count);
  if (p.ps_servers > 0) plan.ps_keys = rank::ps_partition(plan.layout.total_floats(), int(p.ps_servers));
  plan.cp = int(p.cp), plan.cp_split = p.cp_split;
  if (p.cp > 1) plan.cp_positions = cp_positions_of(plan, cfg.seq_len());
  return plan;
}

std::vector<std::vector<int32_t>> cp_positions_of(const RankPlan& plan, int64_t seq) {
  std::vector<std::vector<int32_t>> out;
  for (int r = 0; r < plan.cp && plan.cp > 1; ++r) out.push_back(rank::cp_positions(seq, plan.cp, r, plan.cp_split));
  return out;
}

std::vector<FlatRange> ps_saved_ranges(const RankPlan& server, const ModelConfig& m) {
  if (!server.part.holds_tied_copy(m)) return server.param_ranges;
  const ParamSpec& wte = server.layout.at("wte");
  return subtract(server.param_ranges, {wte.offset, wte.numel});
}

}  // namespace loom
