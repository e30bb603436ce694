// What one rank trains with (Note [Engine parts]): its model (part), memory tracking and the
// parts its plan picks; and the gradient -> update path (Updater, Note [Update rules]).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/memory.h"
#include "loom/engine/estimate.h"
#include "loom/engine/gradient_pass.h"
#include "loom/engine/part.h"
#include "loom/model/model.h"
#include "loom/comm/group.h"
#include "loom/parallel/buckets.h"
#include "loom/rank/duties.h"
#include "loom/optim/loss_scale.h"
#include "loom/optim/optimizer.h"
#include "loom/train/rank_context.h"

namespace loom {

struct TrainOptions;
class GatherPart;
class OffloadPart;
class TwoBwState;
class AsyncPipeState;
namespace parallel {
class GradSync;
class PsWorker;
}  // namespace parallel

struct Engine {
  // The parts of make_parts' table (engine/parts.cc), in hook order.
  Engine(const Config& cfg, RankContext& rc, int64_t mb, int64_t T);

  // A step's forward and backward begin: zeroes the gradients it accumulates into (a part
  // that keeps them zeroes its own; a stream's step may carry them over) and starts the
  // parts' step.
  void begin_step();
  // Every unit gathered (ZeRO-3) or read back (parameter offload), so params() is the whole
  // local part; no-op otherwise.
  void materialize_params();
  // The parameters wherever they live: params(), or a part's mapping of its file (saving,
  // loading, the finite check; valid until the next update).
  std::span<float> param_view();
  // The part of type P the table made, or nullptr: the update rules and the parts that work
  // together bind each other once, when they are made.
  template <class P>
  P* find() const {
    for (const std::unique_ptr<Part>& p : parts)
      if (P* q = dynamic_cast<P*>(p.get())) return q;
    return nullptr;
  }
  // A state store made later (parameter offload, with the optimizer's file): after the
  // stores already there, before the reduction (Note [Engine parts]'s order).
  void add_store(std::unique_ptr<Part> store);

  const RankContext& rc;
  std::vector<int> unit_bucket;  // ZeRO-3: unit -> bucket
  parallel::DataParallelPlan plan;
  Model model;
  MemoryTracker memory;
  std::vector<std::unique_ptr<Part>> parts;  // Note [Engine parts], in hook order
  GradientPass* pass = nullptr;              // one of parts; always there
  size_t stores = 0;                         // parts[0, stores) are state stores
};

// Note [Update rules]
// How a rank's step turns its gradients into new weights, one rule per rank, picked once from
// what the engine runs (update_rule) and called through one table (Updater::step):
//   kSynchronous      every flushing layout: ZeRO stages, loss scaling, clipping, chunked
//                     offload, 1-bit / 0/1 / top-k Adam (below);
//   kTwoBw            Note [PipeDream-2BW]: the delayed updates at the step's end;
//   kParameterServer  Note [Parameter server]: push the gradients, pull the weights;
//   kStream           Note [PipeDream weight stashing], Note [PipeMare]: the stage updated
//                     after each minibatch during the step, the loss summed at its end;
//   kStreamReference  their flushing reference.
// The plan names the rule (rank::update_rule, Note [Rank duties]); a test's flushing
// reference (TrainOptions::two_bw_reference / async_reference) is the one override. The
// order of the enum is the order of Updater::step's table.
using UpdateRule = rank::UpdateRule;
UpdateRule update_rule(const Engine& e);

// Gradients to updated parameters, per ZeRO stage (Note [Sharded buckets]):
//   stage 0: grads all-reduced in place; every rank clips and updates the whole buffer.
//   stage 1: grads reduce-scattered at the step's last micro-batch (only the own pieces are
//            reduced); each rank updates its own pieces, then all-gathers them.
//   stage 2: as stage 1, the gradients sharded as backward makes them (Note [Unreduced
//            gradients]; in a pipeline reduce-scattered at the last micro-batch, as stage 1).
//   stage 3: as stage 2, but the parameters stay sharded: gathered copies are dropped.
// Loss scaling (Note [Dynamic loss scaling]): backward starts from scaler().scale() times
// the loss; step() divides the gradients by it (with the clipping coefficient, one pass)
// or skips the update when they overflowed on any rank.
class Updater {
 public:
  Updater(const Config& cfg, Engine& e);
  // Note [Part memory estimates]: a plain replica's parameters and gradients, and the
  // update rule's moments (this rank's piece under ZeRO; Note [Model-state bytes]).
  static void estimate(const EstimateInputs& in, MemoryEstimate& e);
  struct Result {
    double loss = 0;     // mean loss of the global batch
    double norm = 0;     // global gradient norm before clipping, unscaled (infinite when skipped)
    bool applied = true;  // false: overflow, the step was skipped
    // Note [2BW without a barrier]: between flushes a 2bw step's loss arrives with the next
    // step's result (deferred: `loss` unknown yet); earlier_loss is the previous step's.
    bool deferred = false, has_earlier = false;
    double earlier_loss = 0, earlier_norm = 0;
    // Note [Asynchronous parameter server]: the servers ended the run with this step.
    bool stop = false;
  };
  // flush: Note [PipeDream-2BW] (2bw only: the step ends the pipeline's stream).
  Result step(double local_loss, double lr, int64_t step, bool flush = true);
  const AdamW& adamw() const { return adamw_; }
  AdamW& adamw() { return adamw_; }  // restoring a checkpoint
  LossScaler& scaler() { return scaler_; }
  // Note [Optimizer offload]: the moments move to a scratch file under offload.dir (before
  // the first step or a restore). Throws loom::Error naming the directory when it cannot.
  void offload_optimizer(int global_rank);

 private:
  const Config& cfg_;
  Engine& e_;
  // The parts the rules work with, bound once (null: the table made none).
  parallel::GradSync* sync_ = nullptr;
  GatherPart* gather_part_ = nullptr;
  OffloadPart* offload_ = nullptr;  // made by offload_optimizer
  TwoBwState* two_bw_ = nullptr;
  AsyncPipeState* async_ = nullptr;
  parallel::PsWorker* ps_ = nullptr;
  AdamW adamw_;
  LossScaler scaler_;
  std::vector<FlatRange> norm_ranges_;
  // Note [Compressed Adam with ZeRO]: the counted ranges of the whole local gradient, and
  // the frozen preconditioner D of the whole buffer (gathered at the first compressed step).
  std::vector<FlatRange> local_norm_ranges_;
  std::vector<float> frozen_d_;
  void step_local(double lr, bool sharded);
  // 0/1 Adam (Note [0/1 Adam]): the parameters at the last synchronisation and the
  // bias-corrected learning rates summed since.
  std::vector<float> p_sync_;
  double lr_sum_ = 0;
  void step_zero_one(double lr, int64_t step);
  void step_chunked(const Kernels& k, double lr, double coef);
  // The rules (Note [Update rules]), one signature: (local_loss, lr, step, flush).
  UpdateRule rule_ = UpdateRule::kSynchronous;
  Result step_synchronous(double local_loss, double lr, int64_t step, bool flush);
  Result step_two_bw(double local_loss, double lr, int64_t step, bool flush);
  Result step_ps(double local_loss, double lr, int64_t step, bool flush);
  std::chrono::steady_clock::time_point ps_answered_ = std::chrono::steady_clock::now();
  // Note [2BW without a barrier]: the pending gradient's tied-wte sum and norm, started as
  // soon as it is complete; a step's loss sum, started at its end and taken at the next.
  void start_pending_norm(std::vector<float>& g);
  void start_norm_sum(std::vector<float>& g);  // the mean over replicas, the squares, their sum started
  void start_deferred_norm();
  void poll_deferred_norm();  // starts it if the tied sum is through
  std::vector<float>* deferred_norm_ = nullptr;  // the first stage's pending gradient, squares not yet taken
  void dp_mean(std::vector<float>& g);
  double take_pending_norm();
  void take_earlier_loss(Result& r);
  // Note [Vocabulary passes across a step's end] (parallel/schedule.h): the pending gradient's
  // vocabulary run applied in step `step`'s pass, clipped by the global norm (taken there and
  // kept for the step's end, which applies the rest with the same step count).
  // aside: into that copy of the vocabulary run instead (Note [The next step's first forwards
  // ahead] in parallel/schedule.h).
  void update_vocab(std::vector<float>& pending, int64_t step, std::vector<float>* aside);
  // AdamW of `ranges` of `params` (the parameters, or a copy laid out as their leading floats).
  void update_ranges(std::vector<float>& params, std::vector<float>& g, double norm, double lr,
                     const std::vector<FlatRange>& ranges, bool counts_step);
  float clip_scale(std::vector<float>& g, double norm, const std::vector<FlatRange>& ranges) const;
  // The pending gradient's global norm, taken once (>= 0; -1 before): by update_vocab, the
  // update in the waits or the step's end. wait = false: -1 while its sum still runs.
  double pending_norm(bool wait);
  double pending_norm_ = -1;
  bool vocab_applied_ = false;  // update_vocab applied the pending gradient's vocabulary run
  // Note [2BW's update in the waits] (modes/stream/two_bw_update.cc): W(t) written into the
  // stash, floats [vocab_floats(), next) so far, once the norm is in (ready).
  struct StashUpdate {
    bool ready = false;
    float coef = 1;
    double lr = 0;
    int64_t t = 0, next = 0;
    std::vector<FlatRange> ranges;  // the owned floats the update writes
  };
  StashUpdate stash_update_;
  void update_in_wait(int left);
  bool prepare_stash_update(bool wait);
  void write_stash(int64_t to);
  double finish_in_stash();
  // Note [PipeDream weight stashing] (modes/stream/async_update.cc): one minibatch's update on a
  // pipedream / pipemare stage (after its backward), the tied wte updates a last stage owes,
  // the step's end, and the reference's update.
  void attach_async();
  void update_batch(int64_t batch);
  void catch_up_tied(int64_t until);
  Result step_async(double local_loss, double lr, int64_t step, bool flush);
  Result step_async_reference(double local_loss, double lr, int64_t step, bool flush);
  // Starts summing this step's loss (and [1]: a squared norm) over the ranks, to be taken
  // with the next step's result (Note [2BW without a barrier]); a flush sums at once.
  void sum_loss(Result& r, double local_loss, double sq, bool flush);
  std::vector<FlatRange> untied_;  // a tied head's ranges but wte
  int64_t next_tied_ = 0;          // a tied head: the next minibatch whose wte update is owed
  double applied_sq_ = 0;          // squared norm of the gradients applied in this step
  struct TiedSend {
    std::vector<float> buf;
    comm::Work work;
  };
  std::vector<TiedSend> tied_sends_;  // a tied stage's wte gradients in flight, by minibatch mod pp
  comm::Work wte_work_, norm_work_, loss_work_;
  double norm_buf_[1] = {0}, loss_buf_[2] = {0, 0};
  bool norm_started_ = false, loss_started_ = false;
};

// What the engine needs before the first step beyond the layout (the references tests ask
// for, their hooks, a PS job's initial weights on the servers).
void prepare_engine(const Config& cfg, const TrainOptions& given, const RankContext& rc, Engine& e);

}  // namespace loom
