#include "loom/train/trainer.h"
#include "loom/modes/ps/ps_server.h"

#include <omp.h>
#include <unistd.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <iomanip>
#include <memory>
#include <sstream>
#include <streambuf>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/core/liveness.h"
#include "loom/kernels/cpu/blas_info.h"
#include "loom/model/model.h"
#include "loom/parallel/grad_sync.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/data/loader.h"
#include "loom/train/run_start.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/ckpt/shard_format.h"
#include "loom/optim/optimizer.h"
#include "loom/train/engine.h"
#include "loom/train/memory_budget.h"
#include "loom/modes/offload/offload.h"
#include "loom/train/rank_context.h"
#include "loom/comm/agree.h"
#include "loom/train/report.h"
#include "loom/train/step_observers.h"
#include "loom/train/trace.h"

namespace loom {

namespace {

// Every valid [parallel] layout runs; the launch must match it.
void check_world(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  if (world_size != p.ranks())
    throw Error("the layout dp x tp x pp = " + std::to_string(p.dp) + " x " + std::to_string(p.tp) + " x " +
                std::to_string(p.pp) + (p.ps_servers > 0 ? " + " + std::to_string(p.ps_servers) + " servers" : "") +
                " needs " + std::to_string(p.ranks()) + " ranks but " +
                std::to_string(world_size) + (world_size == 1 ? " process runs" : " were launched") +
                "; launch with `mpirun -np " + std::to_string(p.ranks()) + " loom train ...` or `loom train --nproc " +
                std::to_string(p.ranks()) + "`, or set parallel.dp = " + std::to_string(world_size - p.ps_servers));
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

// Note [Accordion]: its switches are logged.
void log_accordion(Reporter& rep, parallel::GradSync& sync, TrainSummary& sum) {
  for (std::string& line : sync.take_accordion_log()) {
    rep.info(line);
    sum.accordion_log.push_back(std::move(line));
  }
}

std::string layout_line(const Config& cfg, int64_t mb, int64_t T) {
  const ParallelConfig& p = cfg.parallel;
  std::ostringstream os;
  os << "  global batch " << cfg.train.batch << " = micro-batch " << mb << " x " << cfg.train.grad_accum
     << " micro-batches x dp " << p.dp << ", seq " << T << ", " << cfg.train.batch * T << " tokens/step, "
     << cfg.train.steps << " steps, " << omp_get_max_threads() << " threads per rank";
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
    os << "\n  layout pp " << p.pp << " x dp " << p.dp << " x tp " << p.tp << " = " << p.world() << " ranks, zero "
       << p.zero << ", gradient buckets <= " << p.bucket_mb << " MiB (first 1 MiB)"
       << (cfg.comm.grad_dtype == FloatFormat::kBf16 ? ", all-reduced in bf16" : "") << compress_text(p, cfg);
  if (p.ps_servers > 0)
    os << "\n  parameter servers: " << p.ps_servers << " (ps.mode " << name_of(cfg.ps.mode)
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

// Forward and backward of one optimizer step; gradients reduced as the layout says, and
// multiplied by the loss scale S (Note [Dynamic loss scaling]). Returns this rank's share of
// the loss: the mean over its micro-batches (0 on pipeline stages without the head).
double compute_gradients(Engine& e, const RankContext& rc, const DataLoader& data, const Config& cfg, int64_t step,
                         int64_t mb, int64_t T, double S, bool flush) {
  const int64_t accum = cfg.train.grad_accum;
  Model& model = e.model;
  e.begin_step();
  double loss = 0;
  const bool every_micro = e.sync && e.sync->every_micro();
  if (e.sync) e.sync->set_step(step);
  auto arm = [&] {
    if (e.sync) e.sync->begin(model.grad_buffer());
  };
  if (e.two_bw) e.two_bw->begin_reference_step();  // the reference computes on the stash
  if (e.pipe) {
    auto batch = [&](int micro, int32_t* tok, int32_t* tgt) {
      data.train_batch(step, micro, accum, cfg.train.batch, tok, tgt);
    };
    if (rc.schedule->kind == ScheduleKind::k2BW) {  // Note [PipeDream-2BW]
      const parallel::PipelineRunner::Stream o = e.two_bw->executor(flush);
      loss = e.pipe->run_step(batch, float(S / double(accum)), arm, &o);
    } else if (e.async) {  // Note [PipeDream weight stashing], Note [PipeMare]; or their reference
      const parallel::PipelineRunner::Stream o = e.async->executor(step, flush);
      loss = e.pipe->run_step(batch, float(S / double(accum)), arm, &o);
    } else {
      loss = e.pipe->run_step(batch, float(S / double(accum)), arm);
    }
    e.memory.sample();
  } else {
    if (e.ps && e.ps->sparse()) choose_ps_rows(cfg, data, *e.ps, step, mb, T);  // Note [Sparse embeddings]
    std::vector<int32_t> tok(size_t(mb * T)), tgt(size_t(mb * T));
    for (int64_t micro = 0; micro < accum; micro++) {
      const bool last = micro + 1 == accum;
      data.train_batch(step, micro, accum, cfg.train.batch, tok.data(), tgt.data());
      if (last || every_micro) arm();
      loss += model.forward_backward(tok.data(), tgt.data(), mb, T, float(S / double(accum)));
      if (every_micro && !last) e.sync->finish(false);
      e.memory.sample();
    }
  }
  if (e.two_bw) e.two_bw->end_reference_step();
  if (rc.embed) {  // GPT pipeline: the tied embedding's two copies get the sum of both gradients
    const ParamSpec& w = model.layout().at("wte");
    // 2bw: this step's gradient is complete only on a flush (the pending one's is summed as it
    // completes); pipedream / pipemare: each update sums its own.
    const bool summed_elsewhere = (e.two_bw && e.two_bw->pipeline() && !flush) || (e.async && e.async->pipeline());
    if (!summed_elsewhere)
      rc.embed->all_reduce(std::span<float>(model.grads().data() + w.offset, size_t(w.numel)), comm::ReduceOp::kSum);
  }
  if (e.sync) e.sync->finish();
  return loss / double(accum);
}

// Targets and computed positions of one global batch (they differ by padding).
struct StepTokens {
  int64_t real = 0, positions = 0;
  StepTokens& operator+=(const StepTokens& o) {
    real += o.real, positions += o.positions;
    return *this;
  }
};

// data.bucketing (Note [Length bucketing]): this rank's micro-batches, each at its own
// padded length. Micro-batch m returns its mean over its N positions (padding adds 0);
// scaling it by dp N / R (R: the global batch's real targets) makes the dp average of the
// summed gradients the gradient of the global batch's mean over its R real targets.
// Returns this rank's share of that mean (dp times its part, as Updater averages over dp).
double bucketed_gradients(Engine& e, const RankContext& rc, const BucketLoader& data, int64_t step,
                          StepTokens& tokens, double S) {
  const BucketLoader::Step plan = data.plan(step);
  tokens = {plan.real_targets, plan.positions};
  Model& model = e.model;
  if (e.sync) e.sync->set_step(step);
  e.begin_step();
  const bool every_micro = e.sync && e.sync->every_micro();
  std::vector<int32_t> tok, tgt;
  double loss = 0;
  for (size_t m = 0; m < plan.micros.size(); m++) {
    const data::MicroPlan& mp = plan.micros[m];
    const int64_t rows = int64_t(mp.rows.size()), N = rows * mp.seq;
    tok.resize(size_t(N));
    tgt.resize(size_t(N));
    data.fill(mp, tok.data(), tgt.data());
    const bool last = m + 1 == plan.micros.size();
    if (e.sync && (last || every_micro)) e.sync->begin(model.grad_buffer());
    const double scale = double(rc.dp_size) * double(N) / double(plan.real_targets);
    loss += scale * model.forward_backward(tok.data(), tgt.data(), rows, mp.seq, float(scale * S));
    if (every_micro && !last) e.sync->finish(false);
    e.memory.sample();
  }
  if (e.sync) e.sync->finish();
  return loss;
}

// --resume (Note [Resume auto]): this rank's parameters, moments and optimizer step count;
// returns the step to continue from (0 when fresh).
int64_t resume_point(const Config& cfg, const TrainOptions& opt, Engine& e, Updater& updater, const RankContext& rc,
                     comm::World* world, Reporter& rep) {
  // Nothing to load: no state views either (bf16 moments would be widened for nothing, 8
  // bytes a parameter at the run's start).
  if (opt.resume.empty()) return 0;
  ShardState s = rank_state(e, updater, cfg);
  // A PS job's servers load their shards alongside (Note [PS checkpoints]).
  const int64_t step = load_resume(cfg, opt.resume, s, rc.ps ? &world->world_group() : everyone(rc), rep);
  updater.adamw().settle_moments(true);  // bf16 moments: store what was loaded
  if (e.ps) e.ps->start_at(step);
  if (e.chunks) e.chunks->drop_all();  // the file's parameters changed under any resident chunk
  if (e.whole_params) e.pack_from_whole(*updater.adamw().offload_file());  // Note [Replicated-parameter offload]
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
  if (!rc.embed || e.gather) return;
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
  if (e.chunks)  // Note [Chunk manager]: waits on chunk transfers
    e.chunks->set_span_hook([t](const char* what, bool begin) {
      if (begin) t->begin(what, "io");
      else t->end();
    });
  const bool chunks = cfg.parallel.vpp > 1;
  if (e.pipe)
    e.pipe->set_step_hook([t, chunks](parallel::Phase phase, int micro, int chunk, bool begin) {
      if (!begin) return t->end();
      std::string name(1, parallel::phase_letter(phase));
      name += std::to_string(micro);
      if (chunks) name.append(".").append(std::to_string(chunk));
      t->begin(name, "pipeline");
    });
  if (e.async && e.async->pipeline())  // Note [PipeDream weight stashing]: updates inside the stream
    e.async->trace_update = [t](int micro, bool begin) {
      if (begin) t->begin("U" + std::to_string(micro), "pipeline");
      else t->end();
    };
  e.memory.set_listener([t](const MemoryTracker& m) {
    std::vector<std::pair<std::string, int64_t>> now;
    for (const auto& r : m.rows()) now.push_back({r.name, r.now_bytes});
    t->counter(t->now_us(), now);
  });
  return trace;
}

// The step's outcome for the observers; a finite-loss check first (a diverged update stops
// the run before anything is logged or saved from it).
void check_finite_loss(const Config& cfg, int64_t step, double loss) {
  if (!std::isfinite(loss))
    throw diverged(detail::cat("loss is ", loss, " at step ", step + 1), cfg.optim.lr, cfg.optim.warmup_steps);
}

StepOutcome outcome_of(const Config& cfg, int64_t step, const Updater::Result& u, double lr, double loss_scale,
                       const StepTokens& tokens, Clock::time_point start) {
  // A skipped step's loss is checked too: the forward pass has no loss scale, so a
  // non-finite loss there means the weights themselves ran away (issue 59).
  if (!u.deferred) check_finite_loss(cfg, step, u.loss);
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
  if (e.chunks) e.chunks->set_span_hook(nullptr);
  e.memory.set_listener(nullptr);
  if (world) trace.add_ledger(world->ledger());
  trace.add_idle();
  trace.write(path, everyone(e.rc));
  rep.info("wrote trace " + path + " (open in https://ui.perfetto.dev)");
}

// Note [Chunk manager]: what parameter offload's chunks did over the run.
void report_chunks(std::ostream& os, const ChunkManager& m, const Config& cfg, TrainSummary& sum) {
  const ChunkManager::Stats& s = m.stats();
  sum.param_chunk_read_bytes = s.read_bytes, sum.param_chunk_evictions = s.evictions;
  sum.grad_chunk_written_bytes = s.grad_written_bytes;
  sum.param_chunk_last_step_read_bytes = s.last_step_read_bytes;
  os << " (parameter offload: " << m.chunks() << " chunks of "
     << (s.chunk_floats > 0 ? bytes_text(s.chunk_floats * int64_t(sizeof(float))) : std::string("one unit"))
     << ", at most " << bytes_text(s.peak_resident_bytes) << " resident at once; " << s.reads << " reads ("
     << bytes_text(s.read_bytes) << "), " << s.hits << " of " << s.acquires << " acquires found resident, "
     << s.evictions << " evictions; warm-up: " << s.trace_events << " accesses, non-model memory "
     << bytes_text(s.peak_non_model_bytes);
  if (s.replayed_steps > 0)
    os << "; after it " << bytes_text(s.replayed_read_bytes / s.replayed_steps) << " read per step, "
       << bytes_text(s.last_step_read_bytes) << " in the last";
  if (m.manages_grads())
    os << "; gradients in " << m.chunks(ChunkManager::kGrads) << " chunks: " << bytes_text(s.grad_written_bytes)
       << " spilled, " << bytes_text(s.grad_read_bytes) << " read back";
  if (cfg.memory.limit_gib > 0 && s.over_budget_events > 0)
    os << "; " << s.over_budget_events << " acquires needed more than the budget left for chunks";
  os << ")";
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
  if (e.gather)
    os << " (+ gathered units: " << e.gather->peak_units() << " at once, pool of "
       << double(e.gather->pool_bytes()) / (1 << 20) << " MiB)";
  if (e.chunks) report_chunks(os, *e.chunks, cfg, sum);
  sum.memory_peak_total_bytes = e.memory.peak_total();
  os << "; at most " << bytes_text(sum.memory_peak_total_bytes) << " at once";
  if (cfg.memory.limit_gib > 0) os << " (budget memory.limit_gib = " << cfg.memory.limit_gib << ")";
  if (const StateFile* f = u.adamw().offload_file()) {
    sum.offload_read_bytes = f->bytes_read(), sum.offload_written_bytes = f->bytes_written();
    os << (e.chunks ? "; optimizer and parameter offload: " : "; optimizer offload: ") << bytes_text(f->bytes_read()) << " read, " << bytes_text(f->bytes_written())
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
  if (e.gather) {
    sum.param_gathers = e.gather->dp_gathers(), sum.param_gathers_on_host = e.gather->host_gathers();
    if (sum.param_gathers_on_host > 0)
      rep.info("ZeRO++ hpZ: " + std::to_string(sum.param_gathers_on_host) + " of " +
               std::to_string(sum.param_gathers + sum.param_gathers_on_host) +
               " parameter gathers stayed on the host (secondary pieces)");
  }
  if (!e.sync) return;
  sum.comm_hidden_fraction = e.sync->hidden_fraction();
  sum.comm_exposed_s = e.sync->exposed_wait_s();
  std::ostringstream os;
  os << "data parallel: " << e.plan.buckets.size() << " gradient buckets, reduced alone in " << std::fixed
     << std::setprecision(2) << e.sync->standalone_s() * 1e3 << " ms per step; " << std::setprecision(1)
     << 100.0 * sum.comm_hidden_fraction << "% of it hidden behind backward (" << std::setprecision(3)
     << sum.comm_exposed_s << " s of reduction after the last rank's backward, all steps)";
  sum.comm_wire_bytes = e.sync->mean_wire_bytes();
  sum.comm_exact_wire_bytes = e.sync->exact_wire_bytes();
  os << "\n  gradients on the wire: " << std::setprecision(3) << sum.comm_wire_bytes / 1e6 << " MB per step from each rank ("
     << std::setprecision(1) << sum.comm_exact_wire_bytes / std::max(1.0, sum.comm_wire_bytes)
     << "x fewer than exact fp32)";
  rep.info(os.str());
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
  if (e.sync) log_accordion(rep, *e.sync, sum);
  check_budget(cfg, e.memory, everyone, global_rank);
}

// Hands a finished step to the observers (Note [Step observers]). A 2bw step whose loss comes
// with the next step's result (Note [2BW without a barrier]) is held until then.
void publish(const Config& cfg, const Updater::Result& u, const StepOutcome& outcome, StepOutcome& held,
             std::span<StepObserver* const> observers) {
  if (u.has_earlier) {
    held.loss = u.earlier_loss;
    if (updates_per_batch(cfg.parallel.schedule)) held.norm = u.earlier_norm;  // 2bw's was known at its step
    check_finite_loss(cfg, held.step, held.loss);
    for (StepObserver* o : observers) o->after_step(held);
  }
  if (u.deferred) held = outcome;
  else
    for (StepObserver* o : observers) o->after_step(outcome);
}

void report_loss_scaling(Reporter& rep, const LossScaler& ls, int64_t steps) {
  if (!ls.enabled()) return;
  std::ostringstream os;
  os << "loss scaling: " << ls.skipped() << " of " << steps << " steps skipped for a gradient overflow; scale now "
     << ls.scale();
  rep.info(os.str());
}

void set_thread_count(const Config& cfg) {
  if (cfg.train.threads <= 0) return;
  omp_set_num_threads(int(cfg.train.threads));
  openblas_set_num_threads(int(cfg.train.threads));
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

  const int64_t T = cfg.seq_len(), mb = cfg.micro_batch();
  const std::unique_ptr<TrainData> data = load_train_data(cfg, T);
  const DataLoader train_data(*data->train, T, uint64_t(cfg.train.seed), rc.dp_rank, rc.dp_size, data->order);
  const bool free_ps = rc.ps && cfg.ps.free_running();  // Note [Asynchronous parameter server]: worker 0
  const DataLoader val_data(*data->val, T, uint64_t(cfg.train.seed), free_ps ? 0 : rc.dp_rank,  // validates alone
                            free_ps ? 1 : rc.dp_size, data->order);
  static_assert(data::kPadTarget == kIgnoreTarget);
  const std::unique_ptr<BucketLoader> buckets =
      cfg.data.bucketing ? std::make_unique<BucketLoader>(*data, cfg, rc.dp_rank, rc.dp_size) : nullptr;
  check_fits(cfg, rc, mb, T);
  const std::unique_ptr<DirLock> lock = claim_outputs(cfg, given, everyone(rc), rep);  // held to the end of the run
  Engine e(cfg, rc, mb, T);
  prepare_engine(cfg, given, rc, e);
  if (cfg.data.doc_mask) e.model.set_document_mask(data->end_of_document);
  Updater updater(cfg, e);
  comm::Group* const all_ranks = everyone(rc);
  const int global_rank = world ? world->global_rank() : 0;
  if (cfg.offload.optimizer == OffloadTier::kDisk) offload_optimizer(updater, all_ranks, global_rank);

  TrainSummary sum;
  sum.params = ParamLayout(cfg.model).param_count(), sum.unigram_entropy = data->unigram_entropy_nats;
  print_header(rep, cfg, *data, sum.params, mb, T);

  const auto t0 = Clock::now();
  StepTokens total;  // over the steps this run trains
  std::unique_ptr<Trace> trace = given.trace_path.empty() ? nullptr : start_trace(cfg, e, world);
  const Spans spans(trace.get());
  StepLog log(rep, sum, cfg, t0);
  CheckpointTrigger checkpoints(cfg, e, updater, world, spans);
  Validation validation(cfg, e, val_data, rep, sum, data->val_bytes_per_token, spans);
  StepObserver* const observers[] = {&log, &validation, &checkpoints};  // Note [Step observers]
  const int64_t first_step = resume_point(cfg, given, e, updater, rc, world, rep);
  StepOutcome held;  // a 2bw step whose loss comes with the next step's result
  for (int64_t step = first_step; step < cfg.train.steps || (free_ps && first_step < cfg.train.steps); step++) {
    liveness::enter_step(step, global_rank);  // the heartbeat's step; Note [Failpoints]
    const auto step_start = Clock::now();
    const Spans::Scope step_span = spans.open("step " + std::to_string(step + 1), "step");
    const int64_t rows = free_ps ? cfg.train.batch / rc.dp_size : cfg.train.batch;  // free PS: this worker's
    StepTokens tokens{rows * T, rows * T};
    LossScaler& scaler = updater.scaler();
    const double S = scaler.scale();
    const bool flush = flushes_pipeline(cfg, step);  // Note [PipeDream-2BW], Note [Synchronous warm-up]
    const double local_loss = buckets ? bucketed_gradients(e, rc, *buckets, step, tokens, S)
                                      : compute_gradients(e, rc, train_data, cfg, step, mb, T, S, flush);
    if (given.after_gradients) given.after_gradients(step, e.model.grads());
    total += tokens;
    const double lr = lr_at(cfg.optim, step, cfg.train.steps);
    const Updater::Result u = [&] {
      const Spans::Scope span = spans.open("optimizer", "compute");
      return updater.step(local_loss, lr, step, flush);
    }();
    after_update(cfg, e, scaler, rep, sum, free_ps ? nullptr : all_ranks, global_rank);  // free PS: no per-step meeting
    publish(cfg, u, outcome_of(cfg, step, u, lr, scaler.enabled() ? S : 0.0, tokens, step_start), held, observers);
    if (u.stop) break;
  }
  if (rc.ps) finish_ps_worker(cfg, rc, *e.ps, rep, sum, total.real);
  if (trace) finish_trace(*trace, e, world, given.trace_path, rep);
  rep.end_bar();
  report_throughput(rep, e, buckets.get(), total, std::chrono::duration<double>(Clock::now() - t0).count(), sum);
  report_memory(rep, cfg, e, updater, sum);
  report_loss_scaling(rep, updater.scaler(), cfg.train.steps - first_step);
  check_tied_copies(e, rc);
  if (given.keep_params) sum.final_params = final_params(cfg, e, rc);
  if (!cfg.checkpoint.dir.empty() && first_step < cfg.train.steps)
    rep.info("saved checkpoint " + cfg.checkpoint.dir + "/" + shard::step_name(cfg.train.steps) + " (latest)");
  return sum;
}

}  // namespace

TrainSummary train(const Config& cfg, const TrainOptions& opt) { return run(cfg, opt, nullptr); }

TrainSummary train(const Config& cfg, const TrainOptions& opt, comm::World& world) { return run(cfg, opt, &world); }

}  // namespace loom
