// What one rank trains with: its model (part), gradient sync, pipeline runner, ZeRO-3
// parameter gathering, optimizer and memory tracking; and the gradient -> update path.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/memory.h"
#include "loom/model/model.h"
#include "loom/parallel/grad_sync.h"
#include "loom/parallel/pipeline.h"
#include "loom/modes/ps/ps.h"
#include "loom/parallel/zero.h"
#include "loom/rank/duties.h"
#include "loom/optim/loss_scale.h"
#include "loom/optim/optimizer.h"
#include "loom/modes/offload/chunk_manager.h"
#include "loom/modes/offload/offload.h"
#include "loom/train/rank_context.h"
#include "loom/modes/stream/async_pipe.h"
#include "loom/modes/stream/two_bw.h"

namespace loom {

struct TrainOptions;

struct Engine {
  Engine(const Config& cfg, RankContext& rc, int64_t mb, int64_t T);

  // A step's forward and backward begin: zeroes the gradients it accumulates into (under
  // per-micro-batch sharding only the own pieces hold anything; the rest already reads
  // zero) and starts the chunk manager's step (Note [Chunk manager]).
  void begin_step();
  // Every unit gathered (ZeRO-3) or read back (parameter offload), so params() is the whole
  // local part; no-op otherwise.
  void materialize_params();
  // Note [Parameter offload]: the parameters move to `file` (its third array); the flat
  // buffer then holds only the chunks the manager keeps within `budget_bytes` (<= 0: none),
  // and with `grads` the gradient buffer too (Note [Gradient chunks]). With ZeRO-3 the file
  // and the chunks hold the own pieces, packed in owned order (Note [ZeRO-3 offload]).
  // `whole` (ZeRO-1/2 only, Note [Replicated-parameter offload]): a file of the whole
  // parameters for the chunk manager, while `file`'s third array holds the own pieces.
  void offload_params(StateFile& file, uint64_t seed, int64_t chunk_floats, int64_t budget_bytes, bool grads,
                      std::unique_ptr<StateFile> whole = nullptr);
  // Note [Replicated-parameter offload]: the own pieces from the whole parameters' file into
  // `file`'s third array (at the start, and after a resume wrote the whole file).
  void pack_from_whole(StateFile& file);
  // The parameters wherever they live: params(), or a mapping of the offload file (saving,
  // loading, the finite check; valid until the next update). packed_params(): the view holds
  // the own pieces packed in owned order (ZeRO-3 with parameter offload), not the flat buffer.
  std::span<float> param_view();
  bool packed_params() const { return chunks && gather; }

  const RankContext& rc;
  std::vector<int> unit_bucket;  // ZeRO-3: unit -> bucket
  parallel::DataParallelPlan plan;
  Model model;
  MemoryTracker memory;
  std::unique_ptr<parallel::GradSync> sync;
  std::unique_ptr<parallel::ParamGather> gather;  // ZeRO-3 with dp > 1
  std::unique_ptr<parallel::PipelineRunner> pipe;
  // Parameter offload; reads the Updater's offload file, so it is used only while the
  // Updater lives (the trainer's step loop and run end).
  std::unique_ptr<ChunkManager> chunks;
  std::unique_ptr<StateFile> whole_params;  // ZeRO-1/2 with parameter offload: what chunks reads
  // ZeRO-3 with parameter offload: the chunks' buffer, the own pieces packed in owned order
  // (only what the manager keeps is resident).
  std::vector<float> own_pieces;
  // Note [PipeDream-2BW]: a 2bw pipeline stage, or the single-process reference.
  std::unique_ptr<TwoBwState> two_bw;
  // Note [PipeDream weight stashing], Note [PipeMare]: a pipedream / pipemare stage, or a
  // rank of their reference.
  std::unique_ptr<AsyncPipeState> async;
  // Note [Parameter server]: a PS worker's pushes and pulls.
  std::unique_ptr<parallel::PsWorker> ps;

 private:
  std::vector<FlatRange> pack_own_pieces(StateFile& file, uint64_t seed);
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
//   stage 1: grads all-reduced; each rank updates its own pieces, then all-gathers them.
//   stage 2: grads reduce-scattered (only the own pieces are reduced); as stage 1 after.
//   stage 3: as stage 2, but the parameters stay sharded: gathered copies are dropped.
// Loss scaling (Note [Dynamic loss scaling]): backward starts from scaler().scale() times
// the loss; step() divides the gradients by it (with the clipping coefficient, one pass)
// or skips the update when they overflowed on any rank.
class Updater {
 public:
  Updater(const Config& cfg, Engine& e);
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
  void dp_mean(std::vector<float>& g);
  double take_pending_norm();
  void take_earlier_loss(Result& r);
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
