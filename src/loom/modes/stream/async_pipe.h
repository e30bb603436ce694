// Asynchronous pipelines in the engine: PipeDream's weight stashing and PipeMare, each stage
// updating after every minibatch's backward on it (updates_per_batch(kind)).
//
// Note [PipeDream weight stashing]
// Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP
// 2019, Sec. 3.3 (weight stashing, no vertical sync). parallel.schedule = pipedream runs
// the 1F1B stream of Note [Pipeline streams] with one micro-batch per step: each step's batch
// is one minibatch, pp of them in flight, and stage r (tau_r = pp - 1 - r) updates as soon as
// a minibatch's backward is done on it. Minibatch t computes on stage r's weights after t -
// d updates, d = min(t - t0, tau_r) (t0: the step its stream started), forward and backward
// alike, so with s the stream's steady state
//   W_r(t + 1) = AdamW(W_r(t), grad_r f_t(W_0(t - tau_0), ..., W_{p-1}(t - tau_{p-1})))
// - their update rule, each stage at its own delay. A stage holds tau_r + 1 versions, one per
// minibatch in flight: the current weights and tau_r stashed copies, each taken just before
// the update that would overwrite a version some forward used (every version but the
// newest has been stashed by then).
//
// Note [PipeMare]
// Yang et al., "PipeMare: Asynchronous Pipeline Parallel DNN Training", MLSys 2021.
// parallel.schedule = pipemare runs the same stream and updates without stashing: stage r's
// backward of minibatch t runs on the weights current then, W_r(t), while its forward ran on
// W_r(t - d) - a forward/backward discrepancy of d updates. Its two techniques:
//   T1, learning-rate rescheduling (their Sec. 3.1): stage r's update of minibatch k uses
//     lr_k d^(-p_k), d = min(k - k0, tau_r) its delay (k0 the start of its stream: a stream's
//     first minibatches, and every minibatch of a synchronous warm-up, are less delayed than
//     tau_r) and p_k = max(0, 1 - (k - W) / K) (K = parallel.pipemare_lr_steps, W =
//     parallel.sync_warmup_steps: the annealing starts with the asynchrony), so the stages
//     whose gradients are most delayed take small steps early, annealing to the plain
//     schedule K steps after the stream first runs (d = 0: factor 1);
//   T2, discrepancy correction (their Sec. 3.2): the backward runs on u = W_r - d delta_r,
//     where delta_r tracks the stage's recent update velocity,
//     delta <- gamma delta + (1 - gamma) (W_new - W_old) after each update, gamma_r =
//     D^(1 / tau_r) (D = parallel.pipemare_decay; 0 turns T2 off): u extrapolates back to
//     the version the forward used without keeping it.
// delta restarts at zero with each stream, so a checkpoint (taken at a flush) holds all of
// PipeMare's state. Memory: a stage with tau_r > 0 holds delta and u beside W.
//
// Tied weights (GPT's wte on the first and last stage) take the first stage's delay in both
// modes: the first stage updates them with both stages' gradients (the head's, sent after
// the last stage's backward, arrives before the first stage needs it) and sends the summed
// gradient on; the last stage applies the same update (same bits, same step count and
// learning rate) before the forward that needs that version - its copy lags pp - 1 updates,
// so minibatch t's head computes on the wte its embedding computed on. The head's backward
// thus reads the forward's wte in pipemare too (the embedding's backward reads no weights).
//
// The reference (TrainOptions::async_reference): the same layout with flushing 1F1B steps of
// one micro-batch, each rank keeping its stage's last tau_r versions (and wte's, on a tied
// head) and binding them as the stream would; it applies the same updates in the same order
// with the same values, one minibatch at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/memory.h"
#include "loom/model/model.h"
#include "loom/modes/stream/stream_part.h"
#include "loom/parallel/pipeline.h"

namespace loom {

class AsyncPipeState final : public StreamPart {
 public:
  // kind: pipedream or pipemare; pipeline: this rank runs the stream, else it is a rank of the
  // reference. tied_head: a GPT pipeline's last stage (its wte copy follows the first stage's).
  AsyncPipeState(const Config& cfg, ScheduleKind kind, Model& model, MemoryTracker& memory, int pp_rank, int pp,
                 bool pipeline, bool tied_head);

  bool pipeline() const override { return pipeline_; }
  ScheduleKind kind() const { return kind_; }
  int delay() const { return tau_; }  // tau_r = pp - 1 - r
  // The first stage's delay, which tied weights take.
  int tied_delay() const { return pp_ - 1; }
  bool starts_stream() const { return !started_; }
  bool carries_gradients() const override { return pipeline_ && started_; }  // zeroed after each update
  int64_t stream_start() const { return stream_start_; }
  // The executor's part of step `step` (the reference's: weight binding only).
  std::optional<parallel::PipelineRunner::Stream> executor(int64_t step, bool flush) override;
  // Each update sums its own minibatch's wte gradients.
  bool sums_tied_itself(bool) const override { return pipeline_; }
  // A pipeline stage's updates as spans inside the pipeline's steps.
  void trace(Trace* t) override;
  // T1 (Note [PipeMare]): the learning-rate factor of an update of minibatch `batch` on a
  // stage of delay `tau` (at most tau, less early in a stream; 1 for pipedream).
  double lr_scale(int64_t batch, int tau) const;
  // Around each update: the stash / velocity bookkeeping (the update changes params()).
  void before_update(int64_t batch);
  void after_update();
  // Set by the Updater: the update of minibatch `batch` (pipeline: after its backward), and
  // on a tied head (pipeline) the wte updates due before minibatch `batch`'s forward (all,
  // with batch = -1, at a flush).
  std::function<void(int64_t batch)> update;
  std::function<void(int64_t batch)> catch_up_tied;
  // Traces: around each update of a pipeline stage (micro: its micro-batch index as the
  // backward's, 0 or the negative steps back), a span of the pipeline's steps.
  std::function<void(int micro, bool begin)> trace_update;
  // Tests: each forward and backward reports its minibatch and the version it computes on
  // (this stage's updates before it; pipemare backward: before the correction).
  std::function<void(int stage, int64_t batch, bool forward, int64_t version)> on_version;
  // Which minibatch's wte version the tied head's forward of `batch` needs: updates of
  // minibatches < the result must be in.
  int64_t tied_needed(int64_t batch) const;
  // The end of a step (after its updates): a flush ends the stream.
  void end_step(bool flush);

 private:
  struct InFlight {
    int64_t batch, version;
    int stash;  // -1: the current weights
  };
  void bind(float* base);
  void bind_head(float* head_base);
  void bind_forward(int64_t batch);
  void bind_backward(int64_t batch);
  int depth(int64_t batch, int tau) const;  // updates between its forward and backward
  float* corrected(int d);
  // Reference: every unit on `base` (null: the current weights), a tied head's wte at the
  // first stage's version for `batch`; version(d): the weights d updates back.
  void reference_bind(int64_t batch, float* base);
  float* version(int d);

  ScheduleKind kind_;
  Model& model_;
  int pp_, tau_;
  bool pipeline_, tied_head_;
  double decay_ = 0;        // D
  int64_t anneal_ = 1;      // K
  int64_t warmup_ = 0;      // W: parallel.sync_warmup_steps
  bool started_ = false;
  int64_t stream_start_ = 0;
  int64_t step_ = 0;        // the step running
  int64_t updates_ = 0;     // this stage's updates in this run
  std::deque<InFlight> flight_;           // pipeline: forwarded, backward not yet done
  std::vector<std::vector<float>> stash_;  // pipedream pipeline: tau_r copies
  std::vector<int> stash_busy_;  // minibatches computing on each stashed copy
  std::vector<float> delta_, u_;           // pipemare, tau_r > 0
  // Reference: the stage's versions W(t - 1), W(t - 2), ... (history_[k - 1] = k back), and on
  // a tied head wte's and a head-unit buffer mixing them.
  std::deque<std::vector<float>> history_;
  std::deque<std::vector<float>> wte_history_;
  std::vector<float> head_buf_;
  FlatRange wte_{0, 0};
  int head_unit_ = -1;
};

}  // namespace loom
