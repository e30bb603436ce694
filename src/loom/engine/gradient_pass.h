// The gradient pass (Note [Engine parts]): one step's forward and backward over its
// micro-batches, the gradients reduced as the layout says.
#pragma once

#include <cstdint>
#include <memory>

#include "loom/engine/part.h"
#include "loom/parallel/pipeline.h"

namespace loom {

struct Engine;
class StreamPart;
namespace parallel {
class GradSync;
}

// One step's micro-batches as a pass reads them. Micro-batch m (rows x seq tokens) adds
// loss_weight x its mean loss to the step's sum, its backward starting from grad_scale;
// mean() turns the sum into this rank's share of the step's loss.
class MicroBatches {
 public:
  struct Shape {
    int64_t rows = 0, seq = 0;
    float grad_scale = 1;
    double loss_weight = 1;
  };
  virtual ~MicroBatches() = default;
  virtual int64_t count() const = 0;
  virtual Shape shape(int64_t m) const = 0;
  // Micro-batch m's tokens and targets (rows x seq each).
  virtual void fill(int64_t m, int32_t* tokens, int32_t* targets) const = 0;
  virtual double mean(double loss_sum) const = 0;
  // The next step's micro-batches (Note [Vocabulary passes across a step's end] in
  // parallel/schedule.h: a 2bw stream looks the next step's first ones up a step early).
  virtual std::unique_ptr<MicroBatches> following() const;
};

class GradientPass : public Part {
 public:
  // One step: the gradients (times the loss scale the batches carry) reduced as the layout
  // says; returns this rank's share of the loss (0 on pipeline stages without the head).
  virtual double run(const MicroBatches& batches, int64_t step, bool flush) = 0;
  // Validation: the mean loss of one batch (rows x T), without gradients.
  virtual double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t rows, int64_t T) = 0;
  // A stream (or its reference) the pass runs with (Note [PipeDream-2BW], Note [PipeDream
  // weight stashing]).
  void attach(StreamPart* stream) { stream_ = stream; }

 protected:
  GradientPass(Engine& e, parallel::GradSync* sync) : e_(e), sync_(sync) {}
  Engine& e_;
  parallel::GradSync* sync_;  // null: no dp reduction (dp 1, a stream's own mean, servers)
  StreamPart* stream_ = nullptr;
};

// One process or dp (no pipeline): the micro-batches one after another, the reduction
// armed for the last (or each, under per-micro-batch sharding).
class MicroBatchPass final : public GradientPass {
 public:
  MicroBatchPass(Engine& e, parallel::GradSync* sync) : GradientPass(e, sync) {}
  double run(const MicroBatches& batches, int64_t step, bool flush) override;
  double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t rows, int64_t T) override;
};

// pp > 1: the rank's stage runs the pipeline schedule (Note [Pipeline streams]); a stream's
// executor drives it when there is one.
class PipelinePass final : public GradientPass {
 public:
  PipelinePass(Engine& e, parallel::GradSync* sync, parallel::PipeLinks& links, const Config& cfg, int64_t mb, int64_t T);
  double run(const MicroBatches& batches, int64_t step, bool flush) override;
  double forward_loss(const int32_t* tokens, const int32_t* targets, int64_t rows, int64_t T) override;
  void trace(Trace* t) override;

 private:
  std::unique_ptr<parallel::PipelineRunner> pipe_;
  bool chunks_;  // vpp > 1: trace names carry the chunk
};

}  // namespace loom
