// What a training step triggers once its update is done: the report line and the summary's
// per-step rows, checkpoints, validation (Note [Step observers]), and the trace spans
// around each piece of work.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/ckpt/memory_ckpt.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/train/report.h"
#include "loom/train/trace.h"
#include "loom/train/train_options.h"

namespace loom {

namespace comm {
class World;
}
struct Config;
struct Engine;
class Updater;
class Role;
class DataLoader;
namespace data {
class MixedStream;
}
using Clock = std::chrono::steady_clock;

// One finished optimizer step as the loop hands it to its observers.
struct StepOutcome {
  int64_t step = 0;  // 0-based
  double loss = 0, lr = 0, norm = 0;
  double loss_scale = 0;  // > 0: loss scaling is on and the step ran at this scale
  bool applied = true;    // false: skipped for a gradient overflow
  int64_t real_tokens = 0, positions = 0;
  double seconds = 0;  // wall time of forward, backward and update
  Clock::time_point end = Clock::now();  // when the step finished (2bw publishes a step later)
  bool last = false;   // the run's final step
};

// Whether step `step` (0-based) ends with a checkpoint, a validation pass, or either (or is
// the last) or lies in the synchronous warm-up: the steps where a stream schedule flushes
// (Note [PipeDream-2BW], Note [Synchronous warm-up]).
bool saves_checkpoint(const Config& cfg, int64_t step);
bool saves_memory(const Config& cfg, int64_t step);  // Note [In-memory checkpoints]
bool validates(const Config& cfg, int64_t step);
bool flushes_pipeline(const Config& cfg, int64_t step);

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void after_step(const StepOutcome& s) = 0;
  // The loop stops after this step (the same answer on every rank).
  virtual bool stops() const { return false; }
};

// The report line of every step and the summary's per-step rows (losses, step times, loss
// scales, skipped steps); tokens per second over the steps since the last logged line.
class StepLog : public StepObserver {
 public:
  StepLog(Reporter& rep, TrainSummary& sum, const Config& cfg, Clock::time_point t0);
  void after_step(const StepOutcome& s) override;
  // Training on a mixture: log lines carry the shares drawn (Note [Dataset mixtures]).
  void set_mixture(const data::MixedStream* mix) { mix_ = mix; }

 private:
  const data::MixedStream* mix_ = nullptr;
  uint64_t seed_;
  int64_t batch_;
  Reporter& rep_;
  TrainSummary& sum_;
  int64_t log_every_, steps_;
  bool bucketing_;
  Clock::time_point t0_, last_;
  int64_t tokens_since_ = 0;
};

// Collective over `world` (every rank of the job, a parameter server's included): refuses
// non-finite `params` on any rank, then saves `state` as step `done`.
void save_checked(const Config& cfg, int64_t done, const ShardState& state, std::span<const float> params,
                  comm::Group* world, int global_rank);

// Saves a sharded checkpoint every checkpoint.save_every steps and after the last step (a
// free-running PS job: after its last push only, as step train.steps; Note [PS checkpoints]),
// and an in-memory one every checkpoint.memory_every steps (Note [In-memory checkpoints]).
// Every role's (Note [One step loop]): the state is the role's.
class CheckpointTrigger : public StepObserver {
 public:
  // Collective (the in-memory saves' group, Note [In-memory checkpoints]).
  CheckpointTrigger(const Config& cfg, Role& role, comm::World* world, const Spans& spans,
                    std::function<bool()> stop_requested = {});
  void after_step(const StepOutcome& s) override;
  bool stops() const override { return stopped_at_ > 0; }
  // > 0: the step after whose save the job stops (Note [Elastic growth]).
  int64_t stopped_at() const { return stopped_at_; }
  // The saves made, disk and memory, and their mean wall seconds (the measured save cost:
  // loom plan's --save-s, Note [Goodput]).
  void report(Reporter& rep) const;

 private:
  const Config& cfg_;
  Role& role_;
  comm::World* world_;
  const Spans& spans_;
  std::function<bool()> stop_requested_;
  std::unique_ptr<MemorySaver> memory_;  // checkpoint.memory_every > 0
  int64_t stopped_at_ = 0, saves_ = 0, memory_saves_ = 0;
  double save_s_ = 0, memory_save_s_ = 0;
};

// The validation loss every train.val_every steps and after the last step.
class Validation : public StepObserver {
 public:
  Validation(const Config& cfg, Engine& e, const DataLoader& val, Reporter& rep, TrainSummary& sum,
             double bytes_per_token, const Spans& spans)
      : cfg_(cfg), e_(e), val_(val), rep_(rep), sum_(sum), bytes_per_token_(bytes_per_token), spans_(spans) {}
  void after_step(const StepOutcome& s) override;

 private:
  const Config& cfg_;
  Engine& e_;
  const DataLoader& val_;
  Reporter& rep_;
  TrainSummary& sum_;
  double bytes_per_token_;
  const Spans& spans_;
};

// What this rank's checkpoint holds: its parameters, AdamW moments and their ranges, the
// optimizer's step count, the loss scale and its gradient compressors' buffers. Saved by
// CheckpointTrigger, filled by resume.
ShardState rank_state(Engine& e, Updater& updater, const Config& cfg);

}  // namespace loom
