#include "loom/train/engine.h"

#include "loom/rank/state_bytes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/optim/offload.h"
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
    sync = std::make_unique<parallel::GradSync>(*rc.dp, plan, sync_mode(rc), compress.ring_codec());
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
  if (gather) gather->gather_all(chunks ? chunks->file().map(2).data() : nullptr);  // Note [ZeRO-3 offload]
  else if (chunks) chunks->materialize();
}

void Engine::offload_params(StateFile& file, uint64_t seed, int64_t chunk_floats, int64_t budget_bytes,
                            bool grads) {
  std::vector<FlatRange> units;
  float* managed = model.params().data();
  int64_t total = int64_t(model.params().size());
  if (gather) {  // Note [ZeRO-3 offload]
    units = pack_own_pieces(file, seed);
    managed = own_pieces.data(), total = int64_t(own_pieces.size());
    // A unit's whole gradients stay until its reduce-scatter is done, a moment that moves with
    // the other ranks: the memory besides the chunks varies by up to the largest unit.
    int64_t largest = 0;
    for (const parallel::Bucket& b : plan.buckets) largest = std::max(largest, b.count);
    if (budget_bytes > 0) budget_bytes = std::max<int64_t>(1, budget_bytes - largest * int64_t(sizeof(float)));
  } else {
    // The initial weights straight into the file, each tensor written back and dropped from
    // the process as it completes (a resume overwrites them there); the flat buffer was never
    // touched.
    model.init_weights(seed, file.map(2).data(), [&file](int64_t at, int64_t n) { file.flush(2, at, n); });
    for (int u = 0; u < model.units(); u++) units.push_back(model.unit_range(u));
  }
  chunks = std::make_unique<ChunkManager>(file, managed, total, units, chunk_floats, budget_bytes, &memory,
                                          grads ? model.grads().data() : nullptr);
  if (gather) {
    gather->set_own_pieces([this, units](int unit, bool acquire) -> const float* {
      if (!acquire) return chunks->release(unit), nullptr;
      chunks->acquire(unit);
      return own_pieces.data() + units[size_t(unit)].offset;
    });
    return;
  }
  model.set_param_hook([this](int unit, bool acquire) {
    if (acquire) chunks->acquire(unit);
    else chunks->release(unit);
  });
  if (grads)
    model.set_grad_hook([this](int unit, bool begin) {
      if (begin) chunks->acquire_grads(unit);
      else chunks->release_grads(unit);
    });
}

// Note [ZeRO-3 offload]
// Parameter offload with ZeRO-3 (ZeRO-Infinity's layout): a rank's file holds its own pieces
// of every unit packed in owned order - the order of its moments, so the update streams p
// with m and v as without ZeRO - and the chunk manager keeps them in own_pieces under the
// budget. A unit's gather takes its own piece from the manager (read from the file if it
// was evicted), sends it, and hands it back once the all-gather is done; the gathered copy
// lives in the gather pool as before. The initial weights are drawn tensor by tensor into
// the (untouched) flat buffer, this rank's slices copied into the file, the tensor's pages
// handed back: the process never holds more than one tensor of them. Checkpoints save and
// load the packed view (ShardState::params_packed). Returns each unit's packed range.
std::vector<FlatRange> Engine::pack_own_pieces(StateFile& file, uint64_t seed) {
  const std::vector<FlatRange> owned = plan.owned(rc.dp_rank);
  int64_t n = 0;
  for (const FlatRange& r : owned) n += r.count;
  own_pieces.assign(size_t(n), 0.0f);
  release_pages(own_pieces.data(), n * int64_t(sizeof(float)));
  memory.track(memory.category("params"), own_pieces.data(), n * int64_t(sizeof(float)));
  float* const flat = model.params().data();
  const std::span<float> packed = file.map(2);
  model.init_weights(seed, flat, [&](int64_t at, int64_t count) {
    int64_t q = 0;  // packed position of range r
    for (const FlatRange& r : owned) {
      const int64_t lo = std::max(at, r.offset), hi = std::min(at + count, r.offset + r.count);
      if (hi > lo) {
        std::copy(flat + lo, flat + hi, packed.data() + q + (lo - r.offset));
        file.flush(2, q + (lo - r.offset), hi - lo);
      }
      q += r.count;
    }
    release_pages(flat + at, count * int64_t(sizeof(float)));
  });
  release_pages(flat, int64_t(model.params().size() * sizeof(float)));  // the pages tensors shared at their ends
  std::vector<FlatRange> units(unit_bucket.size(), FlatRange{0, 0});
  int64_t q = 0;
  for (size_t b = 0; b < plan.buckets.size(); b++) {
    for (size_t u = 0; u < unit_bucket.size(); u++)
      if (unit_bucket[u] == int(b)) units[u] = {q, owned[b].count};
    q += owned[b].count;
  }
  return units;
}

std::span<float> Engine::param_view() {
  if (chunks) return chunks->file().map(2);
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

void Updater::offload_optimizer(int global_rank) {
  const OffloadConfig& o = cfg_.offload;
  const int64_t group = std::max<int64_t>(1, int64_t(o.sub_group_mb * double(1 << 20)) / int64_t(sizeof(float)));
  const bool params = o.params == OffloadTier::kDisk;  // Note [Parameter offload]: p as the file's third array
  adamw_.offload(std::make_unique<StateFile>(o.dir, global_rank, adamw_.state_floats(), group, int(o.slots), o.direct,
                                             params ? 3 : 2, o.grads == OffloadTier::kDisk));
  if (params)
    e_.offload_params(*adamw_.offload_file(), uint64_t(cfg_.train.seed), o.chunk_floats(),
                      int64_t(cfg_.memory.limit_gib * double(int64_t(1) << 30)), o.grads == OffloadTier::kDisk);
  const StateFile& f = *adamw_.offload_file();
  for (int s = 0; s < f.slot_count(); s++) e_.memory.track(e_.memory.category("optimizer"), f.slot_data(s), f.slot_bytes());
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
  if (sharded && !e_.gather) parallel::gather_pieces(*rc.dp, e_.plan, model.params().data(), nullptr);  // stage 1/2
  return r;
}

// Note [1-bit Adam]: reduce the momentum instead of the gradients; under ZeRO (Note
// [Compressed Adam with ZeRO]) the ranks' g / D, each rank's momentum piece following their mean.
void Updater::step_local(double lr, bool sharded) {
  std::vector<float>& g = e_.model.grads();
  const int64_t frozen_at = cfg_.parallel.compress_warmup(cfg_.train.steps, cfg_.optim.warmup_steps);
  if (!sharded) {
    LOOM_ASSERT(adamw_.owned().size() == 1 && adamw_.owned()[0].offset == 0);
    adamw_.momentum_to_update(g, frozen_at);
    e_.sync->reduce_update(g.data());
    adamw_.step_with_update(e_.model.params(), g, lr, frozen_at);
    return;
  }
  const RankContext& rc = e_.rc;
  if (frozen_d_.empty()) {  // the first compressed step of this run: D whole, from every rank's pieces
    const std::vector<float> own = adamw_.frozen_preconditioner(frozen_at);
    frozen_d_.assign(g.size(), 0.0f);
    parallel::gather_pieces(*rc.dp, e_.plan, frozen_d_.data(), own.data());
    e_.memory.track(e_.memory.category("optimizer"), frozen_d_.data(), int64_t(frozen_d_.size() * sizeof(float)));
  }
  const float* D = frozen_d_.data();
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < g.size(); i++) g[i] = D[i] > 0.0f ? g[i] / D[i] : 0.0f;
  e_.sync->reduce_update(g.data());  // whole buckets: the same mean on every rank
  adamw_.step_with_mean_units(e_.model.params(), g, lr, frozen_at);
  if (e_.sync->every_micro())  // the next step zeroes only the own pieces (Note [Resident memory])
    for (const parallel::Bucket& b : e_.plan.buckets) parallel::release_unowned(b, rc.dp_size, rc.dp_rank, g.data());
}

// Note [Chunk manager]: p streams with m and v and refreshes the resident chunks; managed
// gradients (Note [Gradient chunks]) are made resident and clipped a sub-group at a time.
void Updater::step_chunked(const Kernels& k, double lr, double coef) {
  ChunkManager& chunks = *e_.chunks;
  float* g = e_.model.grads().data();
  AdamW::GroupFn before;
  if (chunks.manages_grads())
    before = [&](int64_t begin, int64_t count) {
      chunks.grads_for_update(begin, count);
      if (coef != 1.0) k.scale_inplace(g + begin, count, float(coef));
    };
  adamw_.step(k, e_.model.params(), e_.model.grads(), lr,
              [&](int64_t begin, int64_t count, const float* p) { chunks.refresh(begin, count, p); }, before);
  chunks.end_step();
}

// Note [PipeDream-2BW]: the gradients complete at this step's end (none, the previous step's,
// and on a flush also this step's), each clipped by its own global norm and applied with its
// own step's learning rate, in order. Nothing is skipped (2bw refuses fp16 loss scaling).
//
// Note [2BW without a barrier]
// Summing the loss and the norms over every rank at the step's end would make the end a
// barrier, after which the forwards ramp up again ((p - 1) F of idle on the last stage, a
// third of 1F1B's bubble at B = 2 F). So a 2bw pipeline starts the pending gradient's sums
// the moment it is complete - the tied wte's all-reduce between the first and last stage,
// then the norm's - on their groups' workers, and takes them at the step's end, by when every
// rank has long started them; and it reports a step's loss one step late (its sum started at
// the step's end, taken at the next). A flush sums synchronously. Same sums, same order on
// every rank: the numbers do not change.
Updater::Result Updater::step_two_bw(double local_loss, double, int64_t step, bool flush) {
  const RankContext& rc = e_.rc;
  const Kernels& k = e_.model.ops();
  TwoBwState& s = *e_.two_bw;
  const std::vector<TwoBwState::Update> updates = s.updates(step, flush);
  s.before_updates(flush);
  Result r;
  sum_loss(r, local_loss, 0, flush);
  for (const TwoBwState::Update& u : updates) {
    std::vector<float>& g = *u.grads;
    double ss = 0;
    if (norm_started_ && &g != &e_.model.grads()) {
      ss = take_pending_norm();
    } else {
      if (s.pipeline()) dp_mean(g);  // a flush's own gradient (the reference's sync reduced it)
      double v[2] = {0, sum_squares(k, g.data(), norm_ranges_)};
      rc.stats_sum(v);
      ss = v[1];
    }
    r.norm = std::sqrt(ss / rc.dp_size);  // every dp replica counted the same gradient
    if (const double coef = clip_coef(r.norm, cfg_.optim.grad_clip); coef != 1.0)
      for (const FlatRange& o : adamw_.owned()) k.scale_inplace(g.data() + o.offset, o.count, float(coef));
    adamw_.step(k, e_.model.params(), g, lr_at(cfg_.optim, u.batch, cfg_.train.steps));
  }
  s.after_updates(flush);
  return r;
}

// Note [Parameter server]: under sync the workers' mean loss; the servers average the
// gradients, clip by their global norm and update; the pull brings the new weights and that
// norm. Under async / ssp (Note [Asynchronous parameter server]) this worker's own loss and
// norm; the servers may answer "stop" (the run's pushes are done). ps.slow_worker sleeps
// (slow_factor - 1) x the time since the last answer first (a straggler for benchmarks).
Updater::Result Updater::step_ps(double local_loss, double, int64_t step, bool) {
  Result r;
  const bool free = cfg_.ps.free_running();
  double v[2] = {local_loss, 0};
  if (!free) e_.rc.stats_sum(v);
  r.loss = free ? local_loss : v[0] / e_.rc.dp_size;
  if (e_.rc.dp_rank == cfg_.ps.slow_worker)
    std::this_thread::sleep_for((std::chrono::steady_clock::now() - ps_answered_) * (cfg_.ps.slow_factor - 1.0));
  const std::vector<float>& g = e_.model.grads();
  const double norm_sq = free ? sum_squares(e_.model.ops(), g.data(), {{0, int64_t(g.size())}}) : 0.0;
  const parallel::PsReply reply = e_.ps->push_pull(g.data(), e_.model.params().data(), step, norm_sq);
  ps_answered_ = std::chrono::steady_clock::now();
  r.norm = reply.norm;
  r.stop = free && reply.stop;
  return r;
}

void Updater::start_pending_norm(std::vector<float>& g) {
  const RankContext& rc = e_.rc;
  if (rc.embed) {  // GPT pipeline: the two tied wte copies' gradients summed
    const ParamSpec& w = e_.model.layout().at("wte");
    wte_work_ = rc.embed->all_reduce(std::span<float>(g.data() + w.offset, size_t(w.numel)), comm::ReduceOp::kSum,
                                     {.async = true, .lazy = true});
    // The head's copy is left out of the norm (norm_ranges_), the embedding's counted: summed
    // first; and before the replicas' mean of the whole gradient.
    if (!rc.holds_tied_copy(cfg_.model) || rc.dp) wte_work_.wait();
  }
  dp_mean(g);
  norm_buf_[0] = sum_squares(e_.model.ops(), g.data(), norm_ranges_);
  norm_work_ = rc.stats->all_reduce(std::span<double>(norm_buf_, 1), comm::ReduceOp::kSum, {.async = true, .lazy = true});
  norm_started_ = true;
}

double Updater::take_pending_norm() {
  wte_work_.wait();
  norm_work_.wait();
  norm_started_ = false;
  return norm_buf_[0];
}

// Note [Streams with data parallelism]: the stage replicas' mean gradient, in place (the
// bucketed sync's kAvg; no-op at dp 1 and wherever a GradSync reduces).
void Updater::dp_mean(std::vector<float>& g) {
  if (!e_.rc.dp || e_.sync) return;
  e_.rc.dp->all_reduce(std::span<float>(g), comm::ReduceOp::kAvg);
}

void Updater::take_earlier_loss(Result& r) {
  if (!loss_started_) return;
  loss_work_.wait();
  loss_started_ = false;
  r.has_earlier = true;
  r.earlier_loss = loss_buf_[0] / (e_.rc.dp_size * e_.rc.tp_size);
  r.earlier_norm = std::sqrt(loss_buf_[1] / e_.rc.dp_size);
}

void Updater::sum_loss(Result& r, double local_loss, double sq, bool flush) {
  const RankContext& rc = e_.rc;
  take_earlier_loss(r);
  if (flush || !rc.stats) {
    double v[2] = {local_loss, sq};
    rc.stats_sum(v);
    r.loss = v[0] / (rc.dp_size * rc.tp_size);
    r.norm = std::sqrt(v[1] / rc.dp_size);  // every dp replica counted the same gradient
  } else {
    loss_buf_[0] = local_loss, loss_buf_[1] = sq;
    loss_work_ = rc.stats->all_reduce(std::span<double>(loss_buf_, 2), comm::ReduceOp::kSum, {.async = true, .lazy = true});
    loss_started_ = r.deferred = true;
  }
}

// Note [0/1 Adam]: gradients all-reduced (exactly or compressed) before the variance
// freezes; local steps after, with the parameter moves synchronised on the schedule's steps.
void Updater::step_zero_one(double lr, int64_t step) {
  const parallel::CompressSpec& spec = e_.sync->spec();
  const int64_t k = spec.variance_updates(step);
  std::vector<float>& p = e_.model.params();
  std::vector<float>& g = e_.model.grads();
  if (!e_.sync->local_gradients()) {  // a variance step: g all-reduced exactly
    adamw_.step_counted(p, g, lr, true, k);
    return;
  }
  if (step + 1 <= spec.var_freeze) {  // before the freeze: g / D compressed, v unchanged
    adamw_.update_units(g, k, true);
    e_.sync->reduce_update(g.data());
    adamw_.update_units(g, k, false);
    adamw_.step_counted(p, g, lr, false, k);
    return;
  }
  // The residuals held g / D until now and hold parameter moves from here (DeepSpeed resets
  // its error buffers at the freeze too); a pure function of the step, so a resume agrees.
  if (step == spec.var_freeze) e_.sync->reset_compressor_state();
  if (p_sync_.empty()) {  // the first local step since the start: p is the same on every rank
    p_sync_ = p;
    e_.memory.track(e_.memory.category("optimizer"), p_sync_.data(), int64_t(p_sync_.size() * sizeof(float)));
  }
  lr_sum_ += adamw_.step_counted(p, g, lr, false, k);
  if (!spec.local_sync(step)) return;
  std::vector<float>& d = g;  // scratch: the move since the last synchronisation
  for (size_t i = 0; i < p.size(); i++) d[i] = p[i] - p_sync_[i];
  e_.sync->reduce_update(d.data());
  for (size_t i = 0; i < p.size(); i++) p[i] = p_sync_[i] + d[i];
  p_sync_ = p;
  adamw_.momentum_from_move(d.data(), lr_sum_, k);
  lr_sum_ = 0;
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
