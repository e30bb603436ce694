#include "loom/train/engine.h"

#include "loom/rank/state_bytes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/modes/offload/offload.h"
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

Engine::Engine(const Config& cfg, RankContext& rc_, int64_t mb, int64_t T)
    : rc(rc_), unit_bucket(rc_.plan->unit_bucket), plan(rc_.plan->dp_plan),
      model(cfg.model, mb, T, KernelBackend::kCpu, model_options(cfg, rc_, plan)) {
  if (cfg.offload.params != OffloadTier::kDisk) model.init_weights(uint64_t(cfg.train.seed));  // else into the file
  const int64_t state_bytes = int64_t(model.params().size() * sizeof(float));
  memory.track(memory.category("params"), model.params().data(), state_bytes);
  memory.track(memory.category("grads"), model.grads().data(), state_bytes);
  memory.category("optimizer");
  memory.track(memory.category("activations"), model.activation_storage(), model.activation_bytes());
  // Note [Streams with data parallelism]: a stream's stages all-reduce each update's gradient
  // themselves (Updater::dp_mean); the bucketed sync would reduce a half-made one.
  if (rc.dp && rc.plan->duties.grad != rank::GradPath::kStreamMean) {
    const parallel::CompressSpec compress = parallel::compress_spec(cfg);
    sync = std::make_unique<parallel::GradSync>(*rc.dp, plan, sync_mode(rc), parallel::ring_codec(compress));
    sync->set_compressors(compress, model.layout().specs());
    sync->set_qgz(cfg.parallel.zeropp_qgz);
    sync->hold_first_tensor(rc.embed != nullptr);
    sync->set_tracker(&memory);
    sync->measure_standalone();
    model.set_grad_ready_hook([this](int first_final) { sync->on_ready(first_final); });
    if (plan.tied_first) {
      const int64_t C = cfg.model.d_model;
      model.set_tied_embedding_hooks({[this] { sync->on_tied_head_done(); },
                                      [this, C](const int32_t* tokens, const float* rows, int64_t n) {
                                        return sync->on_embedding_rows(tokens, rows, n, C);
                                      }});
    }
    if (sync->every_micro()) {
      release_pages(model.grads().data(), state_bytes);  // only own pieces get written
    }
    if (rc.zero == 3) {
      gather = std::make_unique<parallel::ParamGather>(
          *rc.dp, plan, unit_bucket, model.params().data(),
          [this](int unit, float* base) { model.bind_unit_params(unit, base); }, &memory, zero_keep_units(cfg),
          cfg.comm.param_dtype == FloatFormat::kBf16 ? comm::Compression::kBF16
          : cfg.parallel.zeropp_qwz      ? comm::Compression::kInt8
                                         : comm::Compression::kNone,
          rc.dp_node.get());
      model.set_param_hook([this](int unit, bool acquire) {
        if (acquire) gather->acquire(unit);
        else gather->release(unit);
      });
    }
  }
  memory.category("buffers");
  if (rc.ps) {  // Note [Parameter server]
    ps = std::make_unique<parallel::PsWorker>(*rc.ps, parallel::ps_partition(int64_t(model.params().size()),
                                                                              int(cfg.parallel.ps_servers)));
    const ParamSpec& wte = model.layout().at("wte");  // Note [Sparse embeddings]
    ps->set_table({wte.offset, wte.shape[0], wte.shape[1]}, cfg.ps.sparse_embedding);
  }
  if (rc.schedule) {
    pipe = std::make_unique<parallel::PipelineRunner>(*rc.schedule, rc.pp_rank, model, rc_.links, mb, T,
                                                      cfg.comm.p2p_dtype == FloatFormat::kBf16, &memory);
    memory.track(memory.category("buffers"), pipe->recv_buffer().data(),
                 int64_t(pipe->recv_buffer().size() * sizeof(float)));
    if (rc.schedule->kind == ScheduleKind::k2BW) two_bw = std::make_unique<TwoBwState>(model, memory, true);
    if (updates_per_batch(rc.schedule->kind))
      async = std::make_unique<AsyncPipeState>(cfg, rc.schedule->kind, model, memory, rc.pp_rank, rc.pp_size, true,
                                               rc.embed && rc.holds_tied_copy(cfg.model));
  }
}

void Engine::begin_step() {
  if (two_bw && !two_bw->starts_stream()) return;  // the gradient carries over (Note [PipeDream-2BW])
  if (async && async->pipeline() && !async->starts_stream()) return;  // zeroed after each update
  if (chunks) chunks->begin_step();
  if (chunks && chunks->manages_grads()) return;  // zeroed by the chunk manager (Note [Gradient chunks])
  if (!sync || !sync->every_micro()) {
    model.zero_grads();
    return;
  }
  for (const FlatRange& r : plan.owned(rc.dp_rank))
    std::memset(model.grads().data() + r.offset, 0, size_t(r.count) * sizeof(float));
}

void Engine::materialize_params() {
  if (gather) gather->gather_all(chunks ? chunks->file().map(chunks->file().p_array()).data() : nullptr);  // Note [ZeRO-3 offload]
  else if (chunks) chunks->materialize();
}

std::span<float> Engine::param_view() {
  if (chunks) return chunks->file().map(chunks->file().p_array());
  return model.params();
}

Updater::Updater(const Config& cfg, Engine& e)
    : cfg_(cfg), e_(e),
      adamw_(e.model.layout(), cfg.optim,
             e.ps                       ? std::vector<FlatRange>{{0, 0}}  // Note [Parameter server]: the servers'
             : e.rc.zero > 0 && e.rc.dp ? e.plan.owned(e.rc.dp_rank)
                                        : std::vector<FlatRange>{},
             cfg.offload.optimizer == OffloadTier::kDisk),
      scaler_(cfg.train, cfg.optim) {
  // The global norm counts every parameter once: a GPT head stage's wte copy and, on tp
  // ranks other than 0, the replicated tensors are left out.
  norm_ranges_ = adamw_.owned();
  local_norm_ranges_ = {{0, int64_t(e.model.grads().size())}};
  for (const ParamSpec& s : e.model.layout().specs())
    if (!e.rc.counts(s, cfg.model)) {
      norm_ranges_ = subtract(norm_ranges_, {s.offset, s.numel});
      local_norm_ranges_ = subtract(local_norm_ranges_, {s.offset, s.numel});
    }
  if (!(e.rc.zero > 0 && e.rc.dp)) local_norm_ranges_ = norm_ranges_;
  rule_ = update_rule(e);
  if (e.two_bw && e.two_bw->pipeline()) e.two_bw->on_pending = [this](std::vector<float>& g) { start_pending_norm(g); };
  if (e.async) attach_async();
  if (cfg.offload.optimizer == OffloadTier::kDisk) return;  // its buffers are tracked by offload_optimizer
  const int opt = e.memory.category("optimizer");
  for (int which = 0; which < 2; which++) {
    const auto [data, bytes] = adamw_.moment_storage(which);
    e.memory.track(opt, data, bytes);
  }
}

// Note [Update rules]: the rule a rank's step ends with, picked once when the Updater is made.
UpdateRule update_rule(const Engine& e) {
  if (e.two_bw && !e.two_bw->pipeline()) return UpdateRule::kTwoBw;  // the 2bw reference
  if (e.async && !e.async->pipeline()) return UpdateRule::kStreamReference;
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
  ChunkManager* chunks = e_.chunks.get();
  // Stage 3: gathered copies go stale with the update; dropping them first also hands back
  // own pieces a prefetch still holds (Note [ZeRO-3 offload]).
  if (e_.gather) e_.gather->invalidate();
  if (chunks) chunks->begin_update();
  const bool chunked_grads = chunks && chunks->manages_grads();  // Note [Gradient chunks]
  // 1-bit / top-k Adam past the warm-up: each rank's own whole gradient (local_norm_ranges_).
  const bool local = e_.sync && e_.sync->local_gradients();
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
  if (sharded && !e_.gather && !chunks) parallel::gather_pieces(*rc.dp, e_.plan, model.params().data(), nullptr);  // stage 1/2
  return r;
}

// TrainOptions::two_bw_reference (Note [PipeDream-2BW]): flushing steps with the delayed updates.
namespace {

void attach_two_bw_reference(const Config& cfg, Engine& e) {
  LOOM_CHECK(!e.two_bw && (!streams(cfg.parallel.schedule) || cfg.parallel.pp == 1) && cfg.parallel.zero == 0,
             "the 2bw reference runs flushing steps (pp = 1, or a flushing pipeline schedule; zero 0); got schedule ",
             schedule_name(cfg.parallel.schedule), " zero ", cfg.parallel.zero);
  e.two_bw = std::make_unique<TwoBwState>(e.model, e.memory, false);
}

// TrainOptions::async_reference (Note [PipeDream weight stashing]): a flushing pipeline of the
// same layout, one minibatch per step, binding the versions the stream would.
void attach_async_reference(const Config& cfg, const RankContext& rc, Engine& e, const std::string& kind) {
  const ParallelConfig& p = cfg.parallel;
  LOOM_CHECK(!e.async && p.pp > 1 && p.zero == 0 && !streams(p.schedule) && cfg.train.grad_accum == 1 &&
                 cfg.optim.grad_clip == 0,
             "the pipedream / pipemare reference is a flushing pipeline (pp > 1, zero 0) with one micro-batch per step "
             "and no clipping; got schedule ", schedule_name(p.schedule), " pp ", p.pp, " zero ", p.zero, " grad_accum ",
             cfg.train.grad_accum, " grad_clip ", cfg.optim.grad_clip);
  const ScheduleKind k = parse_schedule(kind);
  LOOM_CHECK(updates_per_batch(k), "async_reference = ", kind, ": expected pipedream or pipemare");
  e.async = std::make_unique<AsyncPipeState>(cfg, k, e.model, e.memory, rc.pp_rank, rc.pp_size, false,
                                             rc.embed && rc.holds_tied_copy(cfg.model));
}

}  // namespace

// What the engine needs before the first step beyond the layout: the references tests ask
// for (Note [PipeDream-2BW], Note [PipeDream weight stashing]), their hooks, and a PS job's
// initial weights on the servers (Note [Parameter server]).
void prepare_engine(const Config& cfg, const TrainOptions& given, const RankContext& rc, Engine& e) {
  if (given.two_bw_reference) attach_two_bw_reference(cfg, e);
  if (!given.async_reference.empty()) attach_async_reference(cfg, rc, e, given.async_reference);
  if (e.async) e.async->on_version = given.on_weight_version;
  if (e.ps) {
    e.ps->before_push = given.before_ps_push;
    if (rc.dp_rank == 0) e.ps->init_servers(e.model.params().data());
  }
}

}  // namespace loom
