#include "loom/train/trainer.h"

#include "loom/ckpt/memory_ckpt.h"
#include "loom/modes/ps/ps_server.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <cmath>
#include <iomanip>
#include <memory>
#include <sstream>
#include <streambuf>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/core/omp_wait.h"
#include "loom/kernels/cpu/blas_info.h"
#include "loom/model/model.h"
#include "loom/parallel/grad_sync.h"
#include "loom/rank/cp_chunks.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/data/loader.h"
#include "loom/data/mixture.h"
#include "loom/train/run_start.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/ckpt/shard_format.h"
#include "loom/optim/optimizer.h"
#include "loom/engine/engine.h"
#include "loom/train/memory_budget.h"
#include "loom/modes/offload/offload.h"
#include "loom/train/rank_context.h"
#include "loom/comm/agree.h"
#include "loom/train/report.h"
#include "loom/train/step_loop.h"
#include "loom/train/step_batches.h"
#include "loom/train/step_observers.h"
#include "loom/train/tensorboard.h"
#include "loom/train/trace.h"

namespace loom {

namespace {

// Every valid [parallel] layout runs; the launch must match it.
void check_world(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  if (world_size != p.ranks())
    throw Error("the layout " + p.shape_text() + " needs " + std::to_string(p.ranks()) + " ranks but " +
                std::to_string(world_size) + (world_size == 1 ? " process runs" : " were launched") +
                "; launch with `mpirun -np " + std::to_string(p.ranks()) + " loom train ...` or `loom train --nproc " +
                std::to_string(p.ranks()) + "`" +
                (p.dp_for(world_size) > 0 ? ", or set parallel.dp = " + std::to_string(p.dp_for(world_size)) : ""));
}

// ", gradients compressed by topk (ratio 0.001, ...)" or "".
std::string compress_text(const ParallelConfig& p, const Config& cfg) {
  std::ostringstream os;
  if (p.reduce == GradReduce::kAdasum) os << ", gradients combined by Adasum";
  switch (p.compress) {
    case CompressKind::kNone: return os.str();
    case CompressKind::kTopK:
      os << ", gradients compressed by topk (ratio " << p.compress_ratio << ", momentum " << p.compress_momentum
         << ", error feedback)";
      // Note [Top-k Adam]: DGC is momentum SGD's; under AdamW its sparse sends learn slowly.
      if (!cfg.optim.sgd()) os << "; under AdamW parallel.compress = topk_adam trains closer to exact";
      break;
    case CompressKind::kPowerSgd: os << ", gradients compressed by powersgd (rank " << p.compress_rank
                                     << ", error feedback)"; break;
    case CompressKind::kOneBitAdam: os << ", 1-bit Adam (variance frozen, momentum sent as signs with worker and "
                                          "server error feedback)"; break;
    case CompressKind::kTopKAdam: os << ", top-k Adam (variance frozen, momentum sent as top-k (ratio " << p.compress_ratio
                                      << ") with error feedback)"; break;
    case CompressKind::kZeroOneAdam:
      os << ", 0/1 Adam (variance updated at doubling intervals until step "
         << (p.zero_one_var_freeze_steps >= 0 ? p.zero_one_var_freeze_steps : cfg.optim.warmup_steps)
         << ", gradients and then parameter moves sent as signs; local steps up to " << p.zero_one_local_clip << ")";
      break;
    default: os << ", gradients compressed by " << compress_name(p.compress);
  }
  if (const int64_t w = p.compress_warmup(cfg.train.steps, cfg.optim.warmup_steps); w > 0) os << " after " << w << " exact steps";
  if (p.compress_adapt == CompressAdapt::kAccordion)
    os << ", Accordion: heavy " << (p.compress == CompressKind::kPowerSgd ? "rank " : "ratio ")
       << (p.compress == CompressKind::kPowerSgd ? double(p.accordion_heavy_rank) : p.heavy_ratio())
       << " outside critical regimes (window " << p.accordion_window << " steps, eta " << p.accordion_eta << ")";
  return os.str();
}

std::string layout_line(const Config& cfg, int64_t mb, int64_t T) {
  const ParallelConfig& p = cfg.parallel;
  std::ostringstream os;
  os << "  global batch " << cfg.train.batch << " = micro-batch " << mb << " x " << cfg.train.grad_accum
     << " micro-batches x dp " << p.dp << ", seq " << T << ", " << cfg.train.batch * T << " tokens/step, "
     << cfg.train.steps << " steps, " << omp_get_max_threads() << " threads per rank (" << omp_wait_summary() << ")";
  if (cfg.optim.sgd()) os << ", SGD with momentum " << cfg.optim.momentum;  // Note [SGD with momentum]
  const char* prec = name_of(cfg.train.precision);
  if (cfg.train.precision != Precision::kFp32) os << ", precision " << prec << " (GEMM inputs " << prec << ", fp32 accumulation and master weights)";
  if (cfg.offload.optimizer == OffloadTier::kDisk)
    os << ", AdamW moments offloaded to " << cfg.offload.dir << " (sub-groups of " << cfg.offload.sub_group_mb
       << " MiB, " << cfg.offload.slots << " buffers)";
  if (cfg.memory.limit_gib > 0) os << ", memory budget " << cfg.memory.limit_gib << " GiB per rank";
  switch (loss_scale_mode(cfg.train)) {
    case LossScaler::Mode::kDynamic:
      os << ", dynamic loss scale from " << cfg.train.loss_scale_init << " (x2 after " << cfg.train.loss_scale_window
         << " steps without overflow, x1/2 on one)";
      break;
    case LossScaler::Mode::kStatic: os << ", static loss scale " << cfg.train.loss_scale; break;
    case LossScaler::Mode::kNone: break;
  }
  if (p.world() > 1)
    os << "\n  layout pp " << p.pp << " x dp " << p.dp << (p.cp > 1 ? " x cp " + std::to_string(p.cp) : std::string())
       << " x tp " << p.tp << " = " << p.world() << " ranks, zero "
       << p.zero << ", gradient buckets <= " << p.bucket_mb << " MiB (first 1 MiB)"
       << (cfg.comm.grad_dtype == FloatFormat::kBf16 ? ", all-reduced in bf16" : "") << compress_text(p, cfg)
       << (p.cp > 1 ? std::string(", context parallel: ") + name_of(p.cp_split) + " chunks of " +
                          std::to_string(cfg.local_seq()) + " tokens a rank, K/V all-gathered per layer"
                    : std::string());
  if (p.ps_servers > 0)
    os << "\n  parameter servers: " << p.ps_servers
       << (p.servers() > p.ps_servers ? " per tp x pp shard, " + std::to_string(p.servers()) + " in all" : std::string())
       << " (ps.mode " << name_of(cfg.ps.mode)
       << (cfg.ps.mode == PsMode::kSsp ? ", staleness <= " + std::to_string(cfg.ps.staleness) : std::string())
       << "), workers push gradients and pull the weights each step"
       << (cfg.ps.free_running() ? "; the run ends after " + std::to_string(p.dp * cfg.train.steps) + " pushes"
                                 : std::string());
  if (p.pp > 1)
    os << "\n  pipeline: schedule " << schedule_name(p.schedule) << ", " << p.pp << " ranks x " << p.vpp << " chunks, "
       << cfg.train.grad_accum << " micro-batches per step";
  return os.str();
}

std::vector<float> unpadded_params(const Model& model) {
  std::vector<float> out;
  for (const ParamSpec& s : model.layout().specs())
    out.insert(out.end(), model.params().begin() + s.offset, model.params().begin() + s.offset + s.numel);
  return out;
}

void print_header(Reporter& rep, const Config& cfg, const TrainData& data, int64_t params, int64_t mb, int64_t T) {
  std::ostringstream os;
  const std::string name = cfg.model.notes.empty() ? "'" + cfg.model.preset + "'" : std::string("by shape");
  os << "loom train: " << (cfg.model.arch == Arch::kGpt ? "gpt" : "llama") << " " << name << " "
     << params << " params (" << cfg.model.layers << " layers, d_model " << cfg.model.d_model << ", heads "
     << cfg.model.heads << "/" << cfg.model.kv_heads << ", vocab " << cfg.model.vocab << ")\n"
     << layout_line(cfg, mb, T) << "\n"
     << "  " << data.describe << ", unigram entropy " << std::fixed << std::setprecision(4)
     << data.unigram_entropy_nats << " nats";
  for (const std::string& n : cfg.model.notes) os << "\n  note: " << n;
  rep.info(os.str());
}

// --resume (Note [Resume auto]): this rank's parameters, moments and optimizer step count;
// returns the step to continue from (0 when fresh).
int64_t resume_point(const Config& cfg, const TrainOptions& opt, Engine& e, Updater& updater, const RankContext& rc,
                     comm::World* world, Reporter& rep) {
  // Nothing to load: no state views either (bf16 moments would be widened for nothing, 8
  // bytes a parameter at the run's start).
  comm::Group* const everyone_here = rc.ps ? &world->world_group() : everyone(rc);
  if (opt.resume.empty()) {  // Note [In-memory checkpoints]: an earlier run's steps are not this run's
    if (cfg.checkpoint.memory_every > 0 && drop_memory(cfg, everyone_here))
      rep.info("not resuming: removed the in-memory checkpoints an earlier run with this checkpoint.dir left");
    return 0;
  }
  ShardState s = rank_state(e, updater, cfg);
  // A PS job's servers load their shards alongside (Note [PS checkpoints]).
  const int64_t step = load_resume(cfg, opt.resume, s, everyone_here, rep);
  updater.adamw().settle_moments(true);  // bf16 moments: store what was loaded
  for (const std::unique_ptr<Part>& p : e.parts) p->after_resume(step);
  updater.adamw().set_steps_taken(s.optimizer_steps);
  updater.scaler().restore(s.loss_scale);
  if (rc.zero == 3)  // keep only the own pieces resident, as the engine does from the start
    for (const parallel::Bucket& b : e.plan.buckets) parallel::release_unowned(b, e.plan.dp, rc.dp_rank, e.model.params().data());
  return step;
}

// A GPT pipeline's two wte copies get the same summed gradient and, with the same sync
// (WteBucket::kAloneLast under a per-bucket compressor), the same update: an invariant,
// checked bit for bit at the end of the run (ZeRO-3 keeps only pieces; not checked there).
void check_tied_copies(Engine& e, const RankContext& rc) {
  if (!rc.embed || (rc.zero == 3 && rc.dp)) return;
  const ParamSpec& w = e.model.layout().at("wte");
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the copy's bytes
  for (const float& x : e.param_view().subspan(size_t(w.offset), size_t(w.numel))) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 0x100000001b3ull;
  }
  const int64_t mine[1] = {int64_t(h)};
  int64_t both[2];
  rc.embed->all_gather(std::span<const int64_t>(mine, 1), std::span<int64_t>(both, 2));
  LOOM_ASSERT(both[0] == both[1], "the first and last pipeline stage's tied wte copies differ");
}

std::vector<float> final_params(const Config& cfg, Engine& e, const RankContext& rc) {
  e.materialize_params();
  if (rc.pp_size == 1 && rc.tp_size == 1) return unpadded_params(e.model);
  const ParamLayout whole(cfg.model);
  const std::vector<float> all = gather_whole(cfg.model, e.model.layout(), e.model.params().data(), rc);
  std::vector<float> out;
  for (const ParamSpec& s : whole.specs()) out.insert(out.end(), all.begin() + s.offset, all.begin() + s.offset + s.numel);
  return out;
}

// Records kernel groups, pipeline steps and memory samples of this rank (Note [Trace schema]).
std::unique_ptr<Trace> start_trace(const Config& cfg, Engine& e, comm::World* world) {
  const double origin = world ? world->ledger().origin_steady_us()
                              : std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
  auto trace = std::make_unique<Trace>(world ? world->global_rank() : 0, origin);
  Trace* t = trace.get();
  e.model.set_span_hook([t](const char* what, int layer, bool begin) {
    if (begin) t->begin(layer >= 0 ? std::string(what) + " " + std::to_string(layer) : std::string(what), "compute");
    else t->end();
  });
  for (const std::unique_ptr<Part>& p : e.parts) p->trace(t);
  e.memory.set_listener([t](const MemoryTracker& m) {
    std::vector<std::pair<std::string, int64_t>> now;
    for (const auto& r : m.rows()) now.push_back({r.name, r.now_bytes});
    t->counter(t->now_us(), now);
  });
  return trace;
}

// The step's outcome for the observers (the loop checks its loss, Note [One step loop]).
StepOutcome outcome_of(const Config& cfg, int64_t step, const Updater::Result& u, double lr, double loss_scale,
                       const StepTokens& tokens, Clock::time_point start) {
  StepOutcome o;
  o.step = step, o.loss = u.loss, o.lr = lr, o.norm = u.norm, o.loss_scale = loss_scale, o.applied = u.applied;
  o.real_tokens = tokens.real, o.positions = tokens.positions;
  o.end = Clock::now();
  o.seconds = std::chrono::duration<double>(o.end - start).count();
  o.last = u.stop || (!cfg.ps.free_running() && step + 1 == cfg.train.steps);
  return o;
}

// Stops recording and writes the trace with the ledger's collectives and the idle gaps.
void finish_trace(Trace& trace, Engine& e, comm::World* world, const std::string& path, Reporter& rep) {
  e.model.set_span_hook(nullptr);
  for (const std::unique_ptr<Part>& p : e.parts) p->trace(nullptr);
  e.memory.set_listener(nullptr);
  if (world) trace.add_ledger(world->ledger());
  trace.add_idle();
  trace.write(path, everyone(e.rc));
  rep.info("wrote trace " + path + " (open in https://ui.perfetto.dev)");
}

void report_memory(Reporter& rep, const Config& cfg, Engine& e, const Updater& u, TrainSummary& sum) {
  const int64_t local_params = e.model.layout().param_count();
  sum.model_state_formula_bytes = int64_t(e.rc.plan->state_bytes.total());  // Note [Model-state bytes]
  int64_t states = 0;
  std::ostringstream os;
  os << "memory (rank 0, peak resident MiB):";
  for (const MemoryTracker::Row& r : e.memory.rows()) {
    sum.memory_peak_bytes.push_back({r.name, r.peak_bytes});
    if (r.name != "activations" && r.name != "buffers") states += r.peak_bytes;
    os << " " << r.name << " " << std::fixed << std::setprecision(2) << double(r.peak_bytes) / (1 << 20);
  }
  os << "; model states " << double(states) / (1 << 20) << " vs ZeRO-" << e.rc.zero << " formula "
     << double(sum.model_state_formula_bytes) / (1 << 20) << " for " << local_params << " params at dp "
     << e.rc.dp_size;
  for (const std::unique_ptr<Part>& p : e.parts) p->report_memory(os, sum);
  sum.memory_peak_total_bytes = e.memory.peak_total();
  os << "; at most " << bytes_text(sum.memory_peak_total_bytes) << " at once";
  if (cfg.memory.limit_gib > 0) os << " (budget memory.limit_gib = " << cfg.memory.limit_gib << ")";
  // Beside the tracked buffers: everything the process touched (scratch, the kernels' per-thread
  // buffers, the loaders; ranks run as threads share one process).
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) os << "; process peak RSS " << bytes_text(int64_t(ru.ru_maxrss) * 1024);
  if (const StateFile* f = u.adamw().offload_file()) {
    sum.offload_read_bytes = f->bytes_read(), sum.offload_written_bytes = f->bytes_written();
    os << (cfg.offload.params == OffloadTier::kDisk ? "; optimizer and parameter offload: " : "; optimizer offload: ") << bytes_text(f->bytes_read()) << " read, " << bytes_text(f->bytes_written())
       << " written in sub-groups of " << cfg.offload.sub_group_mb << " MiB per moment through " << f->slot_count()
       << " buffers";
  }
  rep.info(os.str());
}

// Real tokens/s, and the padding (data.bucketing) and the gradient reduction's overlap
// (data parallel) of the run's `seconds`.
void report_throughput(Reporter& rep, Engine& e, const BucketLoader* buckets, const StepTokens& total, double seconds,
                       TrainSummary& sum) {
  sum.tokens_per_s = double(total.real) / seconds;
  if (buckets) {
    sum.padding_fraction = total.positions > 0 ? 1.0 - double(total.real) / double(total.positions) : 0.0;
    std::ostringstream os;
    os << "bucketing: " << buckets->sample_count() << " document samples; " << std::fixed << std::setprecision(1)
       << 100.0 * sum.padding_fraction << "% of the positions computed were padding; " << std::setprecision(0)
       << sum.tokens_per_s << " real tokens/s";
    rep.info(os.str());
  }
  for (const std::unique_ptr<Part>& p : e.parts) p->report_run(rep, sum);
}

// Note [Optimizer offload]: a directory may fail on some ranks only, so they agree first.
void offload_optimizer(Updater& updater, comm::Group* everyone, int global_rank) {
  std::exception_ptr failed;
  try {
    updater.offload_optimizer(global_rank);
  } catch (const Error&) {
    failed = std::current_exception();
  }
  agree_or_throw(everyone, global_rank, failed);
}

// Reports of an update, and the budget check (Note [Memory budget]; collective).
void after_update(const Config& cfg, Engine& e, const LossScaler& scaler, Reporter& rep, TrainSummary& sum,
                  comm::Group* everyone, int global_rank) {
  if (!scaler.event().empty()) rep.info(scaler.event());
  for (const std::unique_ptr<Part>& p : e.parts) p->after_update(rep, sum);
  check_budget(cfg, e.memory, everyone, global_rank);
}

void report_loss_scaling(Reporter& rep, const LossScaler& ls, int64_t steps) {
  if (!ls.enabled()) return;
  std::ostringstream os;
  os << "loss scaling: " << ls.skipped() << " of " << steps << " steps skipped for a gradient overflow; scale now "
     << ls.scale();
  rep.info(os.str());
}

// Note [Dataset mixtures]: the shares a mixture run drew, beside the weights asked for.
void report_mixture(Reporter& rep, const data::MixedStream* mix, const TrainSummary& sum, int64_t steps) {
  if (!mix || sum.mix_drawn.empty()) return;
  std::ostringstream os;
  os << "mixture drawn over steps 1-" << steps << ":" << std::fixed << std::setprecision(2);
  for (int k = 0; k < mix->part_count(); k++)
    os << (k ? ", " : " ") << mix->name(k) << " " << 100 * sum.mix_drawn[size_t(k)] << "% (weight "
       << 100 * mix->mixture().weights()[size_t(k)] << "%)";
  rep.info(os.str());
}

void set_thread_count(const Config& cfg) {
  if (cfg.train.threads <= 0) return;
  omp_set_num_threads(int(cfg.train.threads));
  openblas_set_num_threads(int(cfg.train.threads));
}

// Note [TensorBoard events]: the logging rank's file; a directory it cannot write stops every
// rank before the first step.
std::unique_ptr<TensorBoardWriter> open_tensorboard(const Config& cfg, const RankContext& rc, int global_rank,
                                                    Reporter& rep) {
  std::unique_ptr<TensorBoardWriter> tb;
  std::exception_ptr failed;
  if (rc.logging && !cfg.train.tensorboard.empty()) try {
      tb = std::make_unique<TensorBoardWriter>(cfg.train.tensorboard);
      rep.set_tensorboard(tb.get());
      rep.info("TensorBoard events: " + tb->path());
    } catch (const Error&) {
      failed = std::current_exception();
    }
  agree_or_throw(everyone(rc), global_rank, failed);
  return tb;
}

// The run's figures at its end, as TensorBoard scalars at the last step.
void summary_scalars(TensorBoardWriter& tb, const Config& cfg, const TrainSummary& sum) {
  std::vector<std::pair<std::string, double>> v = {
      {"run/tokens_per_s", sum.tokens_per_s},
      {"run/peak_memory_mib", double(sum.memory_peak_total_bytes) / (1 << 20)}};
  if (sum.comm_wire_bytes > 0) {
    v.push_back({"run/grad_wire_mb_per_step", sum.comm_wire_bytes / 1e6});
    v.push_back({"run/grad_compression_ratio", sum.comm_exact_wire_bytes / sum.comm_wire_bytes});
  }
  if (cfg.parallel.ps_servers > 0) {
    v.push_back({"run/ps_max_staleness", sum.ps_max_staleness});
    v.push_back({"run/ps_mean_staleness", sum.ps_mean_staleness});
  }
  tb.scalars(cfg.train.steps, v);
}

// A trainer's or PS worker's step (Note [One step loop]): forward, backward and the update.
class TrainerRole final : public Role {
 public:
  TrainerRole(const Config& cfg, const TrainOptions& given, Engine& e, Updater& u, const DataLoader& train_data,
              const BucketLoader* buckets, comm::World* world, Reporter& rep, TrainSummary& sum, const Spans& spans)
      : cfg_(cfg), given_(given), e_(e), u_(u), train_data_(train_data), buckets_(buckets), world_(world), rep_(rep),
        sum_(sum), spans_(spans), free_ps_(e.rc.ps && cfg.ps.free_running()),
        global_rank_(world ? world->global_rank() : 0) {}
  int64_t resume() override { return resume_point(cfg_, given_, e_, u_, e_.rc, world_, rep_); }
  // Note [Asynchronous parameter server]: a free-running worker steps until the servers stop it.
  bool runs(int64_t step, int64_t first) const override {
    return step < cfg_.train.steps || (free_ps_ && first < cfg_.train.steps);
  }
  Step step(int64_t step) override;
  ShardState state() override {
    ShardState s = rank_state(e_, u_, cfg_);
    if (e_.rc.ps) s.param_ranges.clear();  // Note [PS checkpoints]: the servers save the state
    return s;
  }
  std::span<const float> params() override { return e_.param_view(); }
  void saved() override { u_.adamw().settle_moments(false); }  // bf16 moments: free the widened copies
  StepTokens total;  // over the steps this run trains

 private:
  const Config& cfg_;
  const TrainOptions& given_;
  Engine& e_;
  Updater& u_;
  const DataLoader& train_data_;
  const BucketLoader* buckets_;
  comm::World* world_;
  Reporter& rep_;
  TrainSummary& sum_;
  const Spans& spans_;
  bool free_ps_;
  int global_rank_;
};

Role::Step TrainerRole::step(int64_t step) {
  const auto step_start = Clock::now();
  const int64_t T = cfg_.seq_len();
  const int64_t rows = free_ps_ ? cfg_.train.batch / e_.rc.dp_size : cfg_.train.batch;  // free PS: this worker's
  StepTokens tokens{rows * T, rows * T};
  LossScaler& scaler = u_.scaler();
  const double S = scaler.scale();
  const bool flush = flushes_pipeline(cfg_, step);  // Note [PipeDream-2BW], Note [Synchronous warm-up]
  const double local_loss = step_gradients(e_, cfg_, train_data_, buckets_, step, S, flush, tokens);
  if (given_.after_gradients) given_.after_gradients(step, e_.model.grads());
  total += tokens;
  const double lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  const Updater::Result u = [&] {
    const Spans::Scope span = spans_.open("optimizer", "compute");
    return u_.step(local_loss, lr, step, flush);
  }();
  // A free-running PS worker has no per-step meeting.
  after_update(cfg_, e_, scaler, rep_, sum_, free_ps_ ? nullptr : everyone(e_.rc), global_rank_);
  Step s;
  s.outcome = outcome_of(cfg_, step, u, lr, scaler.enabled() ? S : 0.0, tokens, step_start);
  s.deferred = u.deferred, s.has_earlier = u.has_earlier;
  s.earlier_loss = u.earlier_loss, s.earlier_norm = u.earlier_norm;
  s.stop = u.stop;
  return s;
}

TrainSummary run(const Config& cfg, const TrainOptions& given, comm::World* world) {
  LOOM_ASSERT(given.out && given.err);
  check_world(cfg, world ? world->world_size() : 1);
  set_thread_count(cfg);  // a parameter server's too
  if (world && world->global_rank() >= cfg.parallel.world()) return run_ps_server(cfg, given, *world);
  RankContext rc = make_rank_context(cfg, world);
  NullBuffer null_buf;
  std::ostream null_out(&null_buf);
  TrainOptions opt = given;
  if (!rc.logging) opt.out = opt.err = &null_out, opt.progress = false;
  Reporter rep(opt, cfg.train.steps);
  if (std::string w = cpu::blas_downgrade_warning(); !w.empty()) rep.info("warning: " + w);

  // T: the whole sequence the loaders read; a context-parallel rank computes its cfg.local_seq()
  // positions of it (Note [Context-parallel chunks]).
  const int64_t T = cfg.seq_len(), Tl = cfg.local_seq(), mb = cfg.micro_batch();
  const std::unique_ptr<TrainData> data = load_train_data(cfg, T);
  DataLoader train_data(*data->train, T, uint64_t(cfg.train.seed), rc.data_rank(), rc.data_size(), data->order);
  const bool free_ps = rc.ps && cfg.ps.free_running();  // Note [Asynchronous parameter server]: worker 0
  DataLoader val_data(*data->val, T, uint64_t(cfg.train.seed), free_ps ? 0 : rc.data_rank(),  // validates alone
                      free_ps ? 1 : rc.data_size(), data->order);
  if (rc.cp_size > 1)
    for (DataLoader* l : {&train_data, &val_data})
      l->keep_columns(rc.plan->cp_positions[size_t(rc.cp_rank)]);
  static_assert(data::kPadTarget == kIgnoreTarget);
  const std::unique_ptr<BucketLoader> buckets =
      cfg.data.bucketing ? std::make_unique<BucketLoader>(*data, cfg, rc.data_rank(), rc.data_size()) : nullptr;
  check_fits(cfg, rc, mb, Tl, given.host_memory);
  const std::unique_ptr<DirLock> lock = claim_outputs(cfg, given, everyone(rc), rep);  // held to the end of the run
  Engine e(cfg, rc, mb, Tl);
  prepare_engine(cfg, given, rc, e);
  if (cfg.data.doc_mask) e.model.set_document_mask(data->end_of_document);
  Updater updater(cfg, e);
  const int global_rank = world ? world->global_rank() : 0;
  if (cfg.offload.optimizer == OffloadTier::kDisk) offload_optimizer(updater, everyone(rc), global_rank);
  const std::unique_ptr<TensorBoardWriter> tb = open_tensorboard(cfg, rc, global_rank, rep);

  TrainSummary sum;
  sum.params = ParamLayout(cfg.model).param_count(), sum.unigram_entropy = data->unigram_entropy_nats;
  print_header(rep, cfg, *data, sum.params, mb, T);

  const auto t0 = Clock::now();
  std::unique_ptr<Trace> trace = given.trace_path.empty() ? nullptr : start_trace(cfg, e, world);
  const Spans spans(trace.get());
  TrainerRole role(cfg, given, e, updater, train_data, buckets.get(), world, rep, sum, spans);
  StepLog log(rep, sum, cfg, t0);
  log.set_mixture(data->train->mixed());
  CheckpointTrigger checkpoints(cfg, role, world, spans, given.stop_requested);
  Validation validation(cfg, e, val_data, rep, sum, data->val_bytes_per_token, spans);
  StepObserver* const observers[] = {&log, &validation, &checkpoints};  // Note [Step observers]
  const int64_t first_step = run_steps(role, cfg, global_rank, spans, observers);  // Note [One step loop]
  StepTokens& total = role.total;
  for (const std::unique_ptr<Part>& p : e.parts) p->end_run(rep, sum, total.real);
  if (trace) finish_trace(*trace, e, world, given.trace_path, rep);
  rep.end_bar();
  report_throughput(rep, e, buckets.get(), total, std::chrono::duration<double>(Clock::now() - t0).count(), sum);
  report_memory(rep, cfg, e, updater, sum);
  report_loss_scaling(rep, updater.scaler(), cfg.train.steps - first_step);
  report_mixture(rep, data->train->mixed(), sum, cfg.train.steps);
  if (tb) summary_scalars(*tb, cfg, sum);
  check_tied_copies(e, rc);
  if (given.keep_params) sum.final_params = final_params(cfg, e, rc);
  sum.stopped_at = checkpoints.stopped_at();
  checkpoints.report(rep);
  if (sum.stopped_at > 0)
    rep.info("stopped after saving step " + std::to_string(sum.stopped_at) + ", as the --elastic supervisor asked, to "
             "go on on more hosts (Note [Elastic growth])");
  else if (!cfg.checkpoint.dir.empty() && first_step < cfg.train.steps)
    rep.info("saved checkpoint " + cfg.checkpoint.dir + "/" + shard::step_name(cfg.train.steps) + " (latest)");
  return sum;
}

}  // namespace

TrainSummary train(const Config& cfg, const TrainOptions& opt) { return run(cfg, opt, nullptr); }

TrainSummary train(const Config& cfg, const TrainOptions& opt, comm::World& world) { return run(cfg, opt, &world); }

}  // namespace loom
