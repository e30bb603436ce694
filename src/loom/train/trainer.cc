#include "loom/train/trainer.h"

#include <omp.h>
#include <unistd.h>
#include <cblas.h>

#include <chrono>
#include <cmath>
#include <iomanip>
#include <memory>
#include <sstream>
#include <streambuf>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/blas_info.h"
#include "loom/model/model.h"
#include "loom/parallel/grad_sync.h"
#include "loom/train/checkpoint.h"
#include "loom/train/data.h"
#include "loom/train/shard_ckpt.h"
#include "loom/train/optimizer.h"
#include "loom/train/engine.h"
#include "loom/train/rank_context.h"
#include "loom/train/report.h"
#include "loom/train/trace.h"

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;

// Every valid [parallel] layout runs; the launch must match it.
void check_world(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  if (world_size != p.world())
    throw Error("the layout dp x tp x pp = " + std::to_string(p.dp) + " x " + std::to_string(p.tp) + " x " +
                std::to_string(p.pp) + " needs " + std::to_string(p.world()) + " ranks but " +
                std::to_string(world_size) + (world_size == 1 ? " process runs" : " were launched") +
                "; launch with `mpirun -np " + std::to_string(p.world()) + " loom train ...` or `loom train --nproc " +
                std::to_string(p.world()) + "`, or set parallel.dp = " + std::to_string(world_size));
}

// Refuses, before allocating, a model whose weights, gradients and AdamW moments alone do
// not fit in this machine's memory (activations come on top).
void check_fits(const Config& cfg, const RankContext& rc) {
  const int64_t params = ParamLayout(cfg.model, {}, rc.part).param_count();
  const int64_t need = zero_model_state_bytes(rc.zero, rc.dp_size, params);
  const int64_t have = int64_t(::sysconf(_SC_PHYS_PAGES)) * int64_t(::sysconf(_SC_PAGESIZE));
  // Ranks of one machine share it; a launch across machines sees only its own here.
  if (have > 0 && need > have)
    throw Error("model.preset '" + cfg.model.preset + "': this rank's part holds " + std::to_string(params) +
                " parameters, whose fp32 weights, gradients and AdamW moments need " +
                std::to_string(need >> 20) + " MiB (ZeRO-" + std::to_string(rc.zero) + ", dp " +
                std::to_string(rc.dp_size) + ") but this machine has " + std::to_string(have >> 20) +
                " MiB; split it (parallel.tp / pp / dp with zero = 3) or size it first with the simulator");
}

class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

// Mean validation loss over the global validation batch. A pipeline computes it on the
// last stage; the stats group brings it to every rank.
double evaluate(Model& model, parallel::PipelineRunner* pipe, const DataLoader& loader, int64_t batches,
                int64_t global_rows, int64_t T, const RankContext& rc) {
  const int64_t rows = loader.shard_rows(global_rows);
  std::vector<int32_t> tok(size_t(rows * T)), tgt(size_t(rows * T));
  double sum = 0;
  for (int64_t i = 0; i < batches; i++) {
    loader.val_batch(i, batches, global_rows, tok.data(), tgt.data());
    sum += pipe ? pipe->forward_only(tok.data(), tgt.data()) : model.forward_loss(tok.data(), tgt.data(), rows, T);
  }
  double v[1] = {sum / double(batches)};
  rc.stats_sum(v);
  return v[0] / (rc.dp_size * rc.tp_size);  // every dp replica's tp ranks hold one copy
}

std::string layout_line(const Config& cfg, int64_t mb, int64_t T) {
  const ParallelConfig& p = cfg.parallel;
  std::ostringstream os;
  os << "  global batch " << cfg.train.batch << " = micro-batch " << mb << " x " << cfg.train.grad_accum
     << " micro-batches x dp " << p.dp << ", seq " << T << ", " << cfg.train.batch * T << " tokens/step, "
     << cfg.train.steps << " steps, " << omp_get_max_threads() << " threads per rank";
  if (p.world() > 1)
    os << "\n  layout pp " << p.pp << " x dp " << p.dp << " x tp " << p.tp << " = " << p.world() << " ranks, zero "
       << p.zero << ", gradient buckets <= " << p.bucket_mb << " MiB (first 1 MiB)";
  if (p.pp > 1)
    os << "\n  pipeline: schedule " << p.schedule << ", " << p.pp << " ranks x " << p.vpp << " chunks, "
       << cfg.train.grad_accum << " micro-batches per step";
  return os.str();
}

std::vector<float> unpadded_params(const Model& model) {
  std::vector<float> out;
  for (const ParamSpec& s : model.layout().specs())
    out.insert(out.end(), model.params().begin() + s.offset, model.params().begin() + s.offset + s.numel);
  return out;
}

void print_header(Reporter& rep, const Config& cfg, const Corpus& corpus, int64_t params, int64_t mb, int64_t T) {
  std::ostringstream os;
  os << "loom train: " << (cfg.model.arch == Arch::kGpt ? "gpt" : "llama") << " '" << cfg.model.preset << "' "
     << params << " params (" << cfg.model.layers << " layers, d_model " << cfg.model.d_model << ", heads "
     << cfg.model.heads << "/" << cfg.model.kv_heads << ", vocab " << cfg.model.vocab << ")\n"
     << layout_line(cfg, mb, T) << "\n"
     << "  corpus " << (cfg.data.path.empty() ? kDefaultCorpusDir : cfg.data.path) << ": " << corpus.files.size()
     << " files, train " << corpus.train.size() << " / val " << corpus.val.size() << " bytes, unigram entropy "
     << std::fixed << std::setprecision(4) << corpus.unigram_entropy_nats << " nats";
  rep.info(os.str());
}

// Forward and backward of one optimizer step; gradients reduced as the layout says.
// Returns this rank's share of the loss: the mean over its micro-batches (0 on pipeline
// stages without the head).
double compute_gradients(Engine& e, const RankContext& rc, const DataLoader& data, const Config& cfg, int64_t step,
                         int64_t mb, int64_t T) {
  const int64_t accum = cfg.train.grad_accum;
  Model& model = e.model;
  e.zero_grads();
  double loss = 0;
  const bool every_micro = e.sync && e.sync->every_micro();
  auto arm = [&] {
    if (e.sync) e.sync->begin(model.grads().data());
  };
  if (e.pipe) {
    auto batch = [&](int micro, int32_t* tok, int32_t* tgt) {
      data.train_batch(step, micro, accum, cfg.train.batch, tok, tgt);
    };
    loss = e.pipe->run_step(batch, 1.0f / float(accum), arm);
    e.memory.sample();
  } else {
    std::vector<int32_t> tok(size_t(mb * T)), tgt(size_t(mb * T));
    for (int64_t micro = 0; micro < accum; micro++) {
      const bool last = micro + 1 == accum;
      data.train_batch(step, micro, accum, cfg.train.batch, tok.data(), tgt.data());
      if (last || every_micro) arm();
      loss += model.forward_backward(tok.data(), tgt.data(), mb, T, 1.0f / float(accum));
      if (every_micro && !last) e.sync->finish(false);
      e.memory.sample();
    }
  }
  if (rc.embed) {  // GPT pipeline: the tied embedding's two copies get the sum of both gradients
    const ParamSpec& w = model.layout().at("wte");
    rc.embed->all_reduce(std::span<float>(model.grads().data() + w.offset, size_t(w.numel)), comm::ReduceOp::kSum);
  }
  if (e.sync) e.sync->finish();
  return loss / double(accum);
}

ShardState rank_state(Engine& e, Updater& updater) {
  const RankContext& rc = e.rc;
  const std::vector<FlatRange> all = {{0, e.model.layout().total_floats()}};
  return {&e.model.layout(), &e.model.params(), &updater.adamw().m(), &updater.adamw().v(),
          rc.zero == 3 && rc.dp ? updater.adamw().owned() : all, updater.adamw().owned(), rc.tp_size, rc.tp_rank,
          updater.adamw().steps_taken()};
}

void save_rank_state(const Config& cfg, int64_t step, Engine& e, Updater& updater, comm::World* world) {
  save_shards(cfg, step, rank_state(e, updater), world ? &world->world_group() : nullptr,
              world ? world->global_rank() : 0);
}

// --resume: this rank's parameters, moments and optimizer step count from a sharded
// checkpoint of any layout of this model; returns the step to continue from (0 when fresh).
int64_t resume_point(const Config& cfg, const TrainOptions& opt, Engine& e, Updater& updater, const RankContext& rc,
                     comm::World* world, Reporter& rep) {
  if (opt.resume.empty()) return 0;
  const std::string where = opt.resume == "auto" ? cfg.checkpoint.dir : opt.resume;
  if (where.empty()) throw ConfigError("--resume auto needs checkpoint.dir (where the checkpoints are)");
  const std::optional<std::string> dir = resolve_step_dir(where);
  if (!dir) {
    if (opt.resume != "auto") throw ConfigError("--resume " + where + ": no sharded checkpoint there (no manifest.json or latest)");
    rep.info("resume auto: no checkpoint in " + where + "; starting at step 0");
    return 0;
  }
  ShardState s = rank_state(e, updater);
  // Every rank loads its own file; they agree on the outcome before any goes on, so one
  // damaged shard fails every rank at once instead of leaving the others in a collective.
  int64_t step = 0;
  std::string error;
  Error::Kind kind = Error::Kind::kRuntime;
  try {
    step = load_shards(*dir, cfg, s, world ? world->global_rank() : 0);
  } catch (const Error& e) {
    if (!world) throw;
    error = e.what(), kind = e.kind();
  }
  if (world) {
    double failed[1] = {error.empty() ? -1.0 : double(world->global_rank())};
    world->world_group().all_reduce(std::span<double>(failed), comm::ReduceOp::kMax);
    if (!error.empty()) throw Error(error, kind);
    if (failed[0] >= 0)
      throw Error("--resume: rank " + std::to_string(int(failed[0])) + " could not load its part of " + *dir +
                  " (its error names the file and the damage)");
  }
  updater.adamw().set_steps_taken(s.optimizer_steps);
  if (rc.zero == 3)  // keep only the own pieces resident, as the engine does from the start
    for (const parallel::Bucket& b : e.plan.buckets) parallel::release_unowned(b, e.plan.dp, rc.dp_rank, e.model.params().data());
  LOOM_CHECK(step <= cfg.train.steps, "--resume: checkpoint ", *dir, " is at step ", step, ", past train.steps = ",
             cfg.train.steps, "; raise train.steps to continue");
  const std::string from = shard_layout(*dir);
  const std::string here = layout_text(cfg.parallel);
  rep.info("resumed from " + *dir + " at step " + std::to_string(step) +
           (from == here ? "" : " (resharded from " + from + " to " + here + ")"));
  return step;
}

void save_final(const Config& cfg, Engine& e, Updater& updater, const RankContext& rc, Reporter& rep) {
  std::vector<float> m, v;
  updater.full_moments(m, v);  // collective under ZeRO: every rank takes part
  const ParamLayout whole(cfg.model);
  e.materialize_params();
  std::vector<float> params = e.model.params();
  if (rc.pp_size > 1 || rc.tp_size > 1) {  // every rank's tensors into the whole layout
    params = gather_whole(cfg.model, e.model.layout(), params.data(), rc);
    m = gather_whole(cfg.model, e.model.layout(), m.data(), rc);
    v = gather_whole(cfg.model, e.model.layout(), v.data(), rc);
  }
  if (!rc.logging) return;
  save_checkpoint(cfg.checkpoint.dir, cfg, rc.pp_size > 1 || rc.tp_size > 1 ? whole : e.model.layout(), params, &m, &v,
                  CheckpointState{cfg.train.steps, updater.adamw().steps_taken()});
  rep.info("saved checkpoint to " + cfg.checkpoint.dir);
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
  const bool chunks = cfg.parallel.vpp > 1;
  if (e.pipe)
    e.pipe->set_step_hook([t, chunks](bool fwd, int micro, int chunk, bool begin) {
      if (!begin) return t->end();
      std::string name(fwd ? "F" : "B");
      name += std::to_string(micro);
      if (chunks) name.append(".").append(std::to_string(chunk));
      t->begin(name, "pipeline");
    });
  e.memory.set_listener([t](const MemoryTracker& m) {
    std::vector<std::pair<std::string, int64_t>> now;
    for (const auto& r : m.rows()) now.push_back({r.name, r.now_bytes});
    t->counter(t->now_us(), now);
  });
  return trace;
}

void report_memory(Reporter& rep, const Config& cfg, Engine& e, TrainSummary& sum) {
  const int64_t local_params = e.model.layout().param_count();
  sum.model_state_formula_bytes = zero_model_state_bytes(e.rc.zero, e.rc.dp_size, local_params);
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
  rep.info(os.str());
}

TrainSummary run(const Config& cfg, const TrainOptions& given, comm::World* world) {
  LOOM_ASSERT(given.out && given.err);
  check_world(cfg, world ? world->world_size() : 1);
  if (cfg.train.threads > 0) {
    omp_set_num_threads(int(cfg.train.threads));
    openblas_set_num_threads(int(cfg.train.threads));
  }
  RankContext rc = make_rank_context(cfg, world);
  NullBuffer null_buf;
  std::ostream null_out(&null_buf);
  TrainOptions opt = given;
  if (!rc.logging) opt.out = opt.err = &null_out, opt.progress = false;
  Reporter rep(opt, cfg.train.steps);
  if (std::string w = cpu::blas_downgrade_warning(); !w.empty()) rep.info("warning: " + w);

  const int64_t T = cfg.seq_len(), mb = cfg.micro_batch();
  const Corpus corpus = load_corpus(cfg.data.path, cfg.data.val_fraction, T);
  const DataLoader train_data(corpus.train, T, uint64_t(cfg.train.seed), rc.dp_rank, rc.dp_size);
  const DataLoader val_data(corpus.val, T, uint64_t(cfg.train.seed), rc.dp_rank, rc.dp_size);
  check_fits(cfg, rc);
  Engine e(cfg, rc, mb, T);
  Updater updater(cfg, e);

  TrainSummary sum;
  sum.params = ParamLayout(cfg.model).param_count();
  sum.unigram_entropy = corpus.unigram_entropy_nats;
  print_header(rep, cfg, corpus, sum.params, mb, T);

  const auto t0 = Clock::now();
  auto last = t0;
  int64_t tokens_since = 0;
  std::unique_ptr<Trace> trace = given.trace_path.empty() ? nullptr : start_trace(cfg, e, world);
  auto mark = [&](const std::string& name, const char* cat) {
    if (trace) trace->begin(name, cat);
  };
  auto unmark = [&] {
    if (trace) trace->end();
  };
  const int64_t first_step = resume_point(cfg, given, e, updater, rc, world, rep);
  for (int64_t step = first_step; step < cfg.train.steps; step++) {
    const auto step_start = Clock::now();
    mark("step " + std::to_string(step + 1), "step");
    const double local_loss = compute_gradients(e, rc, train_data, cfg, step, mb, T);
    const double lr = lr_at(cfg.optim, step, cfg.train.steps);
    mark("optimizer", "compute");
    const auto [loss, norm] = updater.step(local_loss, lr);
    unmark();
    if (!std::isfinite(loss))
      throw Error("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                  " (optim.lr = " + std::to_string(cfg.optim.lr) + "); lower optim.lr or raise optim.warmup_steps");
    sum.losses.push_back(float(loss));
    sum.step_seconds.push_back(std::chrono::duration<double>(Clock::now() - step_start).count());

    tokens_since += cfg.train.batch * T;
    const auto now = Clock::now();
    const bool log_line = (step + 1) % cfg.train.log_every == 0 || step + 1 == cfg.train.steps;
    const double window = std::chrono::duration<double>(now - last).count();
    const double tok_s = window > 0 ? double(tokens_since) / window : 0.0;
    if (log_line) last = now, tokens_since = 0;
    rep.step(step, loss, lr, norm, tok_s, std::chrono::duration<double>(now - t0).count(), log_line);

    const bool last_step = step + 1 == cfg.train.steps;
    if (cfg.checkpoint.save_every > 0 && ((step + 1) % cfg.checkpoint.save_every == 0 || last_step)) {
      mark("checkpoint", "io");
      save_rank_state(cfg, step + 1, e, updater, world);
      unmark();
    }
    if (last_step || (cfg.train.val_every > 0 && (step + 1) % cfg.train.val_every == 0)) {
      mark("validation", "compute");
      sum.final_val_loss = evaluate(e.model, e.pipe.get(), val_data, cfg.train.val_batches, mb * rc.dp_size, T, rc);
      unmark();
      rep.val(step, sum.final_val_loss);
    }
    unmark();
  }
  if (trace) {
    e.model.set_span_hook(nullptr);
    e.memory.set_listener(nullptr);
    if (world) trace->add_ledger(world->ledger());
    trace->add_idle();
    trace->write(given.trace_path, world ? &world->world_group() : nullptr);
    rep.info("wrote trace " + given.trace_path + " (open in https://ui.perfetto.dev)");
  }
  rep.end_bar();
  const double total = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_s = double(cfg.train.steps * cfg.train.batch * T) / total;
  if (e.sync) {
    sum.comm_hidden_fraction = e.sync->hidden_fraction();
    sum.comm_exposed_s = e.sync->exposed_wait_s();
    std::ostringstream os;
    os << "data parallel: " << e.plan.buckets.size() << " gradient buckets, reduced alone in " << std::fixed
       << std::setprecision(2) << e.sync->standalone_s() * 1e3 << " ms per step; " << std::setprecision(1)
       << 100.0 * sum.comm_hidden_fraction << "% of it hidden behind backward (" << std::setprecision(3)
       << sum.comm_exposed_s << " s of reduction after the last rank's backward, all steps)";
    rep.info(os.str());
  }
  report_memory(rep, cfg, e, sum);
  if (given.keep_params) sum.final_params = final_params(cfg, e, rc);
  // With sharded checkpoints on, the last step's shards are the final checkpoint (a
  // whole-model save would replace the directory that holds them).
  if (!cfg.checkpoint.dir.empty() && cfg.checkpoint.save_every == 0) save_final(cfg, e, updater, rc, rep);
  if (cfg.checkpoint.save_every > 0) rep.info("sharded checkpoints in " + cfg.checkpoint.dir + " (latest: step " +
                                              std::to_string(cfg.train.steps) + ")");
  return sum;
}

}  // namespace

TrainSummary train(const Config& cfg, const TrainOptions& opt) { return run(cfg, opt, nullptr); }

TrainSummary train(const Config& cfg, const TrainOptions& opt, comm::World& world) { return run(cfg, opt, &world); }

}  // namespace loom
