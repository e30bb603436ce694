#include "loom/engine/engine.h"

#include "loom/rank/state_bytes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/engine/parts.h"
#include "loom/modes/offload/offload.h"
#include "loom/modes/offload/offload_part.h"
#include "loom/modes/ps/ps_part.h"
#include "loom/modes/stream/async_pipe.h"
#include "loom/modes/stream/two_bw.h"
#include "loom/parallel/zero.h"
#include "loom/train/train_options.h"

namespace loom {

namespace {

ModelOptions model_options(const Config& cfg, const RankContext& rc, const parallel::DataParallelPlan& plan) {
  ModelOptions o;
  if (rc.dp) o.padding = plan.padding;
  o.part = rc.part;
  o.act_slots = rc.act_slots;
  o.w_slots = rc.plan->w_slots;
  o.tp_comm = rc.tp_comm.get();
  o.vocab_comm = rc.vocab_comm.get();
  if (rc.cp_size > 1) {  // Note [Context-parallel chunks]: every cp rank's positions of a sequence
    o.cp.size = rc.cp_size, o.cp.rank = rc.cp_rank, o.cp.seq = cfg.seq_len(), o.cp.comm = rc.cp_comm.get();
    o.cp.positions = rc.plan->cp_positions, o.cp.mode = cfg.parallel.cp_mode;
    o.cp.positions_at = [plan = rc.plan](int64_t seq) { return cp_positions_of(*plan, seq); };
  }
  o.sp = cfg.parallel.sp;
  o.recompute = rc.plan->recompute;
  o.params_elsewhere = cfg.offload.params == OffloadTier::kDisk;  // Note [Parameter offload]
  o.grads_elsewhere = cfg.offload.grads == OffloadTier::kDisk;    // Note [Gradient chunks]
  // Note [Huge pages]: not where ZeRO hands pages back (Note [Resident memory]).
  const int zero = rc.dp ? rc.zero : 0;
  o.huge_params = zero < 3;
  o.huge_grads = zero < 2;
  o.precision = cfg.train.precision;
  return o;
}

// Note [Engine parts]: the one table. Each row reads the plan (duties, layout) and makes a
// part; the order of `parts` is the hook order, the order of construction that of the
// memory tracker's categories (the report's columns).
void make_parts(const Config& cfg, RankContext& rc, Engine& e, int64_t mb, int64_t T) {
  std::unique_ptr<SyncPart> sync;
  std::unique_ptr<GatherPart> gather;
  // Note [Streams with data parallelism]: a stream's stages all-reduce each update's gradient
  // themselves (Updater::dp_mean); the bucketed sync would reduce a half-made one.
  if (rc.dp && rc.plan->duties.grad != rank::GradPath::kStreamMean) {
    sync = std::make_unique<SyncPart>(cfg, rc, e.plan, e.model, e.memory);
    if (rc.zero == 3) gather = std::make_unique<GatherPart>(cfg, rc, e.plan, e.unit_bucket, e.model, e.memory);
  }
  e.memory.category("buffers");
  parallel::GradSync* const reduce = sync ? &sync->sync() : nullptr;
  std::unique_ptr<PsPart> ps = rc.ps ? std::make_unique<PsPart>(cfg, rc, e.model, mb, T) : nullptr;
  std::unique_ptr<GradientPass> pass;
  if (rc.schedule) pass = std::make_unique<PipelinePass>(e, reduce, rc.links, cfg, mb, T);
  else pass = std::make_unique<MicroBatchPass>(e, reduce);
  std::unique_ptr<StreamPart> stream;
  if (rc.schedule && rc.schedule->kind == ScheduleKind::k2BW)  // Note [PipeDream-2BW]
    stream = std::make_unique<TwoBwState>(e.model, e.memory, true,
                                          stream_param_copies(ScheduleKind::k2BW, rc.pp_size, rc.pp_rank) > 1);
  else if (rc.schedule && updates_per_batch(rc.schedule->kind))  // Note [PipeDream weight stashing]
    stream = std::make_unique<AsyncPipeState>(cfg, rc.schedule->kind, e.model, e.memory, rc.pp_rank, rc.pp_size, true,
                                              rc.embed && rc.holds_tied_copy(cfg.model));
  if (gather) e.parts.push_back(std::move(gather));
  e.stores = e.parts.size();
  if (sync) e.parts.push_back(std::move(sync));
  e.pass = pass.get();
  e.parts.push_back(std::move(pass));
  if (stream) {
    e.pass->attach(stream.get());
    e.parts.push_back(std::move(stream));
  }
  if (ps) e.parts.push_back(std::move(ps));
}

}  // namespace

Engine::Engine(const Config& cfg, RankContext& rc_, int64_t mb, int64_t T)
    : rc(rc_), unit_bucket(rc_.plan->unit_bucket), plan(rc_.plan->dp_plan),
      model(cfg.model, mb, T, KernelBackend::kCpu, model_options(cfg, rc_, plan)) {
  if (cfg.offload.params != OffloadTier::kDisk) model.init_weights(uint64_t(cfg.train.seed));  // else into the file
  const int64_t state_bytes = int64_t(model.params().size() * sizeof(float));
  memory.track(memory.category("params"), model.params().data(), state_bytes);
  memory.track(memory.category("grads"), model.grads().data(), state_bytes);
  memory.category("optimizer");
  memory.track(memory.category("activations"), model.activation_storage(), model.activation_bytes());
  for (const auto& [p, bytes] : model.pass_buffers()) memory.track(memory.category("buffers"), p, bytes);
  make_parts(cfg, rc_, *this, mb, T);
}

void Engine::begin_step() {
  for (const std::unique_ptr<Part>& p : parts)
    if (p->carries_gradients()) return;  // Note [PipeDream-2BW]; pipedream / pipemare zero after each update
  for (const std::unique_ptr<Part>& p : parts) p->begin_step();
  for (const std::unique_ptr<Part>& p : parts)
    if (p->zero_gradients()) return;
  model.zero_grads();
}

void Engine::materialize_params() {
  for (const std::unique_ptr<Part>& p : parts)
    if (p->materialize_params()) return;
}

std::span<float> Engine::param_view() {
  for (const std::unique_ptr<Part>& p : parts)
    if (const std::span<float> v = p->param_view(); !v.empty()) return v;
  return model.params();
}

void Engine::add_store(std::unique_ptr<Part> store) {
  parts.insert(parts.begin() + std::ptrdiff_t(stores), std::move(store));
  stores++;
}

namespace {

parallel::GradSync* sync_of(const Engine& e) {
  SyncPart* const p = e.find<SyncPart>();
  return p ? &p->sync() : nullptr;
}

parallel::PsWorker* ps_of(const Engine& e) {
  PsPart* const p = e.find<PsPart>();
  return p ? &p->worker() : nullptr;
}

}  // namespace

void Updater::estimate(const EstimateInputs& in, MemoryEstimate& e) {
  e.params = e.grads = in.param_bytes();
  e.moment_floats = in.zero >= 1 ? in.params / in.shards() : in.params;
  e.optimizer_in_memory = int64_t(
      rank::model_state_bytes(double(in.params), in.shards(), in.zero, rank::engine_widths(in.cfg.optim)).optimizer);
  e.optimizer = e.optimizer_in_memory;
}

MemoryEstimate estimate_parts(const EstimateInputs& in) {  // Note [Part memory estimates]
  using Estimate = void (*)(const EstimateInputs&, MemoryEstimate&);
  static constexpr Estimate kParts[] = {&Updater::estimate, &GatherPart::estimate, &SyncPart::estimate,
                                        &PsPart::estimate,  &OffloadPart::estimate, &StreamPart::estimate};
  MemoryEstimate e;
  for (const Estimate part : kParts) part(in, e);
  e.activations = in.activation_bytes;
  return e;
}

Updater::Updater(const Config& cfg, Engine& e)
    : cfg_(cfg), e_(e), sync_(sync_of(e)), gather_part_(e.find<GatherPart>()), two_bw_(e.find<TwoBwState>()),
      async_(e.find<AsyncPipeState>()), ps_(ps_of(e)),
      adamw_(e.model.layout(), cfg.optim,
             ps_                        ? std::vector<FlatRange>{{0, 0}}  // Note [Parameter server]: the servers'
             : e.rc.zero > 0 && e.rc.dp ? e.plan.owned(e.rc.dp_rank)
                                        : std::vector<FlatRange>{},
             cfg.offload.optimizer == OffloadTier::kDisk),
      scaler_(cfg.train, cfg.optim) {
  // The global norm counts every parameter once: a GPT head stage's wte copy and, on tp
  // ranks other than 0, the replicated tensors are left out (a PS worker: of its whole buffer).
  norm_ranges_ = ps_ ? std::vector<FlatRange>{{0, int64_t(e.model.grads().size())}} : adamw_.owned();
  local_norm_ranges_ = {{0, int64_t(e.model.grads().size())}};
  for (const ParamSpec& s : e.model.layout().specs())
    if (!e.rc.counts(s, cfg.model)) {
      norm_ranges_ = subtract(norm_ranges_, {s.offset, s.numel});
      local_norm_ranges_ = subtract(local_norm_ranges_, {s.offset, s.numel});
    }
  if (!(e.rc.zero > 0 && e.rc.dp)) local_norm_ranges_ = norm_ranges_;
  rule_ = update_rule(e);
  if (two_bw_ && two_bw_->pipeline()) {
    two_bw_->on_pending = [this](std::vector<float>& g) { start_pending_norm(g); };
    two_bw_->on_backward = [this] { poll_deferred_norm(); };
    two_bw_->on_wait = [this](int left) { update_in_wait(left); };
    two_bw_->on_vocab_update = [this](std::vector<float>& g, int64_t step, std::vector<float>* aside) {
      update_vocab(g, step, aside);
    };
    two_bw_->on_ahead = [this] { finish_in_stash(); };
  }
  if (async_) attach_async();
  if (cfg.offload.optimizer == OffloadTier::kDisk) return;  // its buffers are tracked by offload_optimizer
  const int opt = e.memory.category("optimizer");
  for (int which = 0; which < 2; which++) {
    const auto [data, bytes] = adamw_.moment_storage(which);
    e.memory.track(opt, data, bytes);
  }
}

// Note [Update rules]: the rule a rank's step ends with, picked once when the Updater is made.
UpdateRule update_rule(const Engine& e) {
  for (const std::unique_ptr<Part>& p : e.parts)  // a test's flushing reference
    if (const StreamPart* s = dynamic_cast<const StreamPart*>(p.get()); s && !s->pipeline())
      return dynamic_cast<const TwoBwState*>(s) ? UpdateRule::kTwoBw : UpdateRule::kStreamReference;
  return e.rc.plan->duties.update;
}

Updater::Result Updater::step(double local_loss, double lr, int64_t step, bool flush) {
  using Rule = Result (Updater::*)(double, double, int64_t, bool);
  static constexpr Rule kRules[] = {&Updater::step_synchronous, &Updater::step_two_bw, &Updater::step_ps,
                                    &Updater::step_async, &Updater::step_async_reference};
  return (this->*kRules[size_t(rule_)])(local_loss, lr, step, flush);
}

// Note [Sharded buckets]'s stages, loss scaling and 1-bit / 0/1 Adam: every flushing layout.
Updater::Result Updater::step_synchronous(double local_loss, double lr, int64_t step, bool) {
  const RankContext& rc = e_.rc;
  Model& model = e_.model;
  const Kernels& k = model.ops();
  ChunkManager* chunks = offload_ ? &offload_->chunks() : nullptr;
  // Stage 3: gathered copies go stale with the update; dropping them first also hands back
  // own pieces a prefetch still holds (Note [ZeRO-3 offload]).
  if (gather_part_) gather_part_->gather().invalidate();
  if (chunks) chunks->begin_update();
  const bool chunked_grads = chunks && chunks->manages_grads();  // Note [Gradient chunks]
  // 1-bit / top-k Adam past the warm-up: each rank's own whole gradient (local_norm_ranges_).
  const bool local = sync_ && sync_->local_gradients();
  const std::vector<FlatRange>& counted = local ? local_norm_ranges_ : norm_ranges_;
  double v[2] = {local_loss, chunked_grads ? chunks->grad_sum_squares(k, norm_ranges_)
                                           : sum_squares(k, model.grads().data(), counted)};
  rc.stats_sum(v);  // every rank: one non-finite gradient anywhere makes v[1] non-finite
  Result r;
  r.loss = v[0] / (rc.dp_size * rc.tp_size);  // each dp replica's tp ranks hold one copy
  const bool sharded = rc.zero > 0 && rc.dp;
  const double S = scaler_.scale();  // a power of two: dividing by it is exact
  // Sharded: each rank counted its own pieces of the reduced gradient. Unsharded: every dp
  // rank counted its gradients, the same after the reduction; 1-bit Adam's local ones make
  // this the root mean square of the ranks' norms.
  r.norm = std::sqrt(sharded && !local ? v[1] : v[1] / rc.dp_size) / S;
  r.applied = scaler_.update(std::isfinite(r.norm), step);
  if (!r.applied) {
    if (chunks) chunks->end_step();
    return r;
  }
  // Unscale and clip in one pass: g <- g (coef / S); coef / S is exact, so this equals
  // clipping the unscaled gradients. Gradient chunks are scaled as the update takes them, and
  // the plain update reads coef g itself (AdamW::step's grad_scale: the same bits, no pass).
  const double coef = clip_coef(r.norm, cfg_.optim.grad_clip) / S;
  const bool zero_one = cfg_.parallel.compress == CompressKind::kZeroOneAdam;
  const bool fused = !zero_one && !local && !chunks && !cfg_.optim.sgd();  // AdamW::update_run
  if (coef != 1.0 && !chunked_grads && !fused)
    for (const FlatRange& o : local ? std::vector<FlatRange>{{0, int64_t(model.grads().size())}} : adamw_.owned())
      k.scale_inplace(model.grads().data() + o.offset, o.count, float(coef));
  if (zero_one) {
    step_zero_one(lr, step);
  } else if (local) {
    step_local(lr, sharded);
  } else if (!chunks) {
    adamw_.step(k, model.params(), model.grads(), lr, {}, {}, fused ? float(coef) : 1.0f);
  } else {
    step_chunked(k, lr, coef);
  }
  if (sharded && !gather_part_ && !chunks) parallel::gather_pieces(*rc.dp, e_.plan, model.params().data(), nullptr);  // stage 1/2
  return r;
}

// TrainOptions::two_bw_reference (Note [PipeDream-2BW]): flushing steps with the delayed updates.
namespace {

void attach_two_bw_reference(const Config& cfg, Engine& e) {
  LOOM_CHECK(!e.find<StreamPart>() && (!streams(cfg.parallel.schedule) || cfg.parallel.pp == 1) && cfg.parallel.zero == 0,
             "the 2bw reference runs flushing steps (pp = 1, or a flushing pipeline schedule; zero 0); got schedule ",
             schedule_name(cfg.parallel.schedule), " zero ", cfg.parallel.zero);
  auto stream = std::make_unique<TwoBwState>(e.model, e.memory, false);
  e.pass->attach(stream.get());
  e.parts.push_back(std::move(stream));
}

// TrainOptions::async_reference (Note [PipeDream weight stashing]): a flushing pipeline of the
// same layout, one minibatch per step, binding the versions the stream would.
void attach_async_reference(const Config& cfg, const RankContext& rc, Engine& e, const std::string& kind) {
  const ParallelConfig& p = cfg.parallel;
  LOOM_CHECK(!e.find<StreamPart>() && p.pp > 1 && p.zero == 0 && !streams(p.schedule) && cfg.train.grad_accum == 1 &&
                 cfg.optim.grad_clip == 0,
             "the pipedream / pipemare reference is a flushing pipeline (pp > 1, zero 0) with one micro-batch per step "
             "and no clipping; got schedule ", schedule_name(p.schedule), " pp ", p.pp, " zero ", p.zero, " grad_accum ",
             cfg.train.grad_accum, " grad_clip ", cfg.optim.grad_clip);
  const ScheduleKind k = parse_schedule(kind);
  LOOM_CHECK(updates_per_batch(k), "async_reference = ", kind, ": expected pipedream or pipemare");
  auto stream = std::make_unique<AsyncPipeState>(cfg, k, e.model, e.memory, rc.pp_rank, rc.pp_size, false,
                                                 rc.embed && rc.holds_tied_copy(cfg.model));
  e.pass->attach(stream.get());
  e.parts.push_back(std::move(stream));
}

}  // namespace

// What the engine needs before the first step beyond the layout: the references tests ask
// for (Note [PipeDream-2BW], Note [PipeDream weight stashing]), their hooks, and a PS job's
// initial weights on the servers (Note [Parameter server]).
void prepare_engine(const Config& cfg, const TrainOptions& given, const RankContext& rc, Engine& e) {
  if (given.two_bw_reference) attach_two_bw_reference(cfg, e);
  if (!given.async_reference.empty()) attach_async_reference(cfg, rc, e, given.async_reference);
  if (AsyncPipeState* async = e.find<AsyncPipeState>()) async->on_version = given.on_weight_version;
  if (PsPart* ps = e.find<PsPart>()) {
    ps->worker().before_push = given.before_ps_push;
    if (rc.dp_rank == 0) ps->worker().init_servers(e.model.params().data());
  }
}

}  // namespace loom
