#include "loom/train/step_observers.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <sstream>

#include "loom/ckpt/memory_ckpt.h"
#include "loom/comm/agree.h"
#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/data/loader.h"
#include "loom/data/mixture.h"
#include "loom/engine/engine.h"
#include "loom/train/step_loop.h"
#include "loom/train/trace.h"

namespace loom {

// Note [Step observers]
// The step loop (trainer.cc) does one thing: forward, backward and the update of each
// step. What a step then triggers is an observer, called in a fixed order with the step's
// outcome: StepLog (report line, summary rows), Validation, CheckpointTrigger. Each decides
// from the step number and its config keys whether it acts, and wraps its own work in a
// trace span. The order matters in that the log line of step s comes before that step's
// validation line, as users read them, and validation comes before the checkpoint: a
// non-finite validation loss stops the run before the state that gave it is saved. A new per-step duty (a
// profiler window, an early stop) is a new observer, not a new branch in the loop.

StepLog::StepLog(Reporter& rep, TrainSummary& sum, const Config& cfg, Clock::time_point t0)
    : seed_(uint64_t(cfg.train.seed)), batch_(cfg.train.batch), rep_(rep), sum_(sum), log_every_(cfg.train.log_every),
      steps_(cfg.train.steps), bucketing_(cfg.data.bucketing), t0_(t0), last_(t0) {}

void StepLog::after_step(const StepOutcome& s) {
  if (!s.applied) sum_.skipped_steps.push_back(s.step + 1);
  if (s.loss_scale > 0) sum_.loss_scales.push_back(s.loss_scale);
  sum_.losses.push_back(float(s.loss));
  sum_.step_seconds.push_back(s.seconds);
  Reporter::StepLine line;
  line.step = s.step, line.loss = s.loss, line.lr = s.lr, line.norm = s.norm;
  line.log_line = (s.step + 1) % log_every_ == 0 || s.step + 1 == steps_;
  line.padding = bucketing_ ? 1.0 - double(s.real_tokens) / double(s.positions) : -1.0;
  line.loss_scale = s.loss_scale, line.skipped = !s.applied;
  tokens_since_ += s.real_tokens;
  const auto now = s.end;  // not the publishing moment: Note [2BW without a barrier] publishes late
  const double window = std::chrono::duration<double>(now - last_).count();
  line.tok_s = window > 0 ? double(tokens_since_) / window : 0.0;
  line.elapsed = std::chrono::duration<double>(now - t0_).count();
  if (line.log_line) last_ = now, tokens_since_ = 0;
  if (mix_ && (line.log_line || s.step + 1 == steps_)) {  // Note [Dataset mixtures]
    const std::vector<uint64_t> n = mix_->mixture().drawn(uint64_t(s.step + 1) * uint64_t(batch_), seed_);
    sum_.mix_drawn.clear();
    for (int k = 0; k < mix_->part_count(); k++) {
      const double share = double(n[size_t(k)]) / double(uint64_t(s.step + 1) * uint64_t(batch_));
      sum_.mix_drawn.push_back(share);
      if (line.log_line) line.mix.push_back({mix_->name(k), share});
    }
  }
  rep_.step(line);
}

ShardState rank_state(Engine& e, Updater& updater, const Config& cfg) {
  const RankContext& rc = e.rc;
  const std::vector<FlatRange> all = {{0, e.model.layout().total_floats()}};
  ShardState s{&e.model.layout(), e.param_view(), updater.adamw().moment(0), updater.adamw().moment(1),
               rc.zero == 3 && rc.dp ? updater.adamw().owned() : all, updater.adamw().owned(), rc.tp_size, rc.tp_rank,
               updater.adamw().steps_taken(), updater.scaler().state()};
  // Each part's own: the compressors' (Note [Compressor state in checkpoints]), the packed view.
  for (const std::unique_ptr<Part>& p : e.parts) p->save_state(s);
  return s;
}

// The run's end is a sharded step like any other (Note [Checkpoint directory ownership]).
// Nothing is saved when any rank's parameters hold a NaN or an infinity: a diverged run
// stops with an error and the previous checkpoint stays the newest.
bool saves_checkpoint(const Config& cfg, int64_t step) {
  const int64_t every = cfg.checkpoint.save_every, done = step + 1;
  return !cfg.checkpoint.dir.empty() && ((every > 0 && done % every == 0) || done == cfg.train.steps);
}

// Note [In-memory checkpoints]: every memory_every steps, never at the end (the disk save is
// there).
bool saves_memory(const Config& cfg, int64_t step) {
  const int64_t every = cfg.checkpoint.memory_every, done = step + 1;
  return every > 0 && done % every == 0 && done != cfg.train.steps;
}

bool validates(const Config& cfg, int64_t step) {
  const int64_t every = cfg.train.val_every;
  return step + 1 == cfg.train.steps || (every > 0 && (step + 1) % every == 0);
}

// Note [Synchronous warm-up]: the warm-up steps flush too. Only a stream (2bw, pipedream,
// pipemare) or a test's reference of one reads the flag; the flushing schedules ignore it.
bool flushes_pipeline(const Config& cfg, int64_t step) {
  return validates(cfg, step) || saves_checkpoint(cfg, step) || saves_memory(cfg, step) ||
         step < cfg.parallel.sync_warmup_steps;
}

namespace {

void refuse_non_finite(const Config& cfg, int64_t done, std::span<const float> params, comm::Group* world,
                       int global_rank) {
  std::exception_ptr bad;
  if (!std::all_of(params.begin(), params.end(), [](float x) { return std::isfinite(x); }))
    bad = std::make_exception_ptr(diverged("parameters hold NaN or infinity after step " + std::to_string(done) +
                                               " (the earlier checkpoints are kept)",
                                           cfg.optim.lr, cfg.optim.warmup_steps));
  agree_or_throw(world, global_rank, bad);
}

}  // namespace

void save_checked(const Config& cfg, int64_t done, const ShardState& state, std::span<const float> params,
                  comm::Group* world, int global_rank) {
  refuse_non_finite(cfg, done, params, world, global_rank);
  save_shards(cfg, done, state, world, global_rank);
}

CheckpointTrigger::CheckpointTrigger(const Config& cfg, Role& role, comm::World* world, const Spans& spans,
                                     std::function<bool()> stop_requested)
    : cfg_(cfg), role_(role), world_(world), spans_(spans), stop_requested_(std::move(stop_requested)) {
  if (cfg.checkpoint.memory_every > 0) memory_ = std::make_unique<MemorySaver>(cfg, world);
}

void CheckpointTrigger::after_step(const StepOutcome& s) {
  if (memory_) memory_->poll();
  const bool free_ps = cfg_.parallel.ps_servers > 0 && cfg_.ps.free_running();
  const bool disk = free_ps ? s.last && !cfg_.checkpoint.dir.empty() : saves_checkpoint(cfg_, s.step);
  const bool memory = !free_ps && saves_memory(cfg_, s.step);
  if (!disk && !memory) return;
  const Spans::Scope span = spans_.open("checkpoint", "io");
  comm::Group* const group = world_ ? &world_->world_group() : nullptr;
  const int rank = world_ ? world_->global_rank() : 0;
  const int64_t done = free_ps ? cfg_.train.steps : s.step + 1;
  if (disk) {
    const auto t0 = Clock::now();
    save_checked(cfg_, done, role_.state(), role_.params(), group, rank);
    saves_++, save_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (memory) {  // Note [In-memory checkpoints]
    const auto t0 = Clock::now();
    if (!disk) refuse_non_finite(cfg_, done, role_.params(), group, rank);
    memory_->save(done, role_.state());
    memory_saves_++, memory_save_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  role_.saved();
  // The run is over and its last step on disk: the hosts' in-memory stores go.
  if (s.last && memory_) memory_->finish(true);
  // Note [Elastic growth]: asked to stop? One agreement, so every rank stops after this save.
  if (!stop_requested_ || s.last) return;
  int64_t asked = stop_requested_() ? 1 : 0;
  if (world_) world_->world_group().all_reduce(std::span<int64_t>(&asked, 1), comm::ReduceOp::kMax);
  if (asked) stopped_at_ = s.step + 1;
  if (asked && memory_) memory_->finish(false);  // the step the job resumes from, whole on two hosts
}

void CheckpointTrigger::report(Reporter& rep) const {
  auto line = [&](const char* what, int64_t n, double seconds, const char* why) {
    if (n == 0) return;
    char each[32];
    std::snprintf(each, sizeof each, "%.3g", seconds / double(n));
    rep.info(detail::cat(what, n, " saved, ", each, " s each on rank 0 (", why, ")"));
  };
  line("checkpoints: ", saves_, save_s_, "the --save-s of loom plan's goodput, Note [Goodput]");
  line("in-memory checkpoints: ", memory_saves_, memory_save_s_, "Note [In-memory checkpoints]");
}

namespace {

// Mean validation loss over the global validation batch. A pipeline computes it on the
// last stage; the stats group brings it to every rank.
double evaluate(Engine& e, const DataLoader& loader, int64_t batches, int64_t global_rows, int64_t T) {
  const RankContext& rc = e.rc;
  const int64_t rows = loader.shard_rows(global_rows);
  std::vector<int32_t> tok(size_t(rows * T)), tgt(size_t(rows * T));
  double sum = 0;
  for (int64_t i = 0; i < batches; i++) {
    loader.val_batch(i, batches, global_rows, tok.data(), tgt.data());
    sum += e.pass->forward_loss(tok.data(), tgt.data(), rows, T);
  }
  double v[1] = {sum / double(batches)};
  // Every dp replica's tp ranks hold one copy. Without a stats group (one process, or a
  // free-running PS worker validating the whole batch alone) the sum is this rank's own, or
  // its replica's (Note [Parameter server with model parallelism]).
  if (rc.stats) {
    rc.stats_sum(v);
    return v[0] / (rc.dp_size * rc.tp_size);
  }
  if (rc.ps_replica) rc.ps_replica->all_reduce(std::span<double>(v, 1), comm::ReduceOp::kSum);
  return v[0] / rc.tp_size;
}

}  // namespace

void Validation::after_step(const StepOutcome& s) {
  if (!validates(cfg_, s.step) && !s.last) return;
  // A free-running PS worker 0 validates alone (its loader is shard 0 of 1): the same rows
  // as the workers together, as dp_size times the batches of one micro-batch each.
  const bool alone = e_.rc.ps && cfg_.ps.free_running();
  if (alone && e_.rc.dp_rank != 0) return;
  const Spans::Scope span = spans_.open("validation", "compute");
  const int64_t global_rows = cfg_.micro_batch() * (alone ? 1 : e_.rc.data_size());
  const int64_t batches = cfg_.train.val_batches * (alone ? e_.rc.data_size() : 1);
  sum_.final_val_loss = evaluate(e_, val_, batches, global_rows, cfg_.local_seq());
  // Every rank holds the same reduced value, so every rank stops here together.
  if (!std::isfinite(sum_.final_val_loss))
    throw diverged(detail::cat("the validation loss is ", sum_.final_val_loss, " after step ", s.step + 1),
                   cfg_.optim.lr, cfg_.optim.warmup_steps);
  rep_.val(s.step, sum_.final_val_loss, bytes_per_token_);
}

}  // namespace loom
