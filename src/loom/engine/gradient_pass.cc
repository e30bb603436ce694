#include "loom/engine/gradient_pass.h"

#include <optional>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/engine/engine.h"
#include "loom/modes/stream/stream_part.h"
#include "loom/parallel/grad_sync.h"
#include "loom/train/trace.h"

namespace loom {

std::unique_ptr<MicroBatches> MicroBatches::following() const {
  LOOM_ASSERT(false, "these micro-batches cannot name the next step's");
  return nullptr;
}

double MicroBatchPass::run(const MicroBatches& batches, int64_t step, bool) {
  Model& model = e_.model;
  e_.begin_step();
  if (sync_) sync_->set_step(step);
  if (stream_) stream_->begin_pass();  // the 2bw reference computes on the stash
  const bool every_micro = sync_ && sync_->every_micro();
  const int64_t n = batches.count();
  std::vector<int32_t> tok, tgt;
  double loss = 0;
  for (int64_t m = 0; m < n; m++) {
    const MicroBatches::Shape s = batches.shape(m);
    tok.resize(size_t(s.rows * s.seq));
    tgt.resize(tok.size());
    batches.fill(m, tok.data(), tgt.data());
    const bool last = m + 1 == n;
    if (sync_ && (last || every_micro)) sync_->begin(model.grad_buffer());
    loss += s.loss_weight * model.forward_backward(tok.data(), tgt.data(), s.rows, s.seq, s.grad_scale);
    if (every_micro && !last) sync_->finish(false);
    e_.memory.sample();
  }
  if (stream_) stream_->end_pass();
  if (sync_) sync_->finish();
  return batches.mean(loss);
}

double MicroBatchPass::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t rows, int64_t T) {
  return e_.model.forward_loss(tokens, targets, rows, T);
}

PipelinePass::PipelinePass(Engine& e, parallel::GradSync* sync, parallel::PipeLinks& links, const Config& cfg,
                           int64_t mb, int64_t T)
    : GradientPass(e, sync), chunks_(cfg.parallel.vpp > 1) {
  const RankContext& rc = e.rc;
  pipe_ = std::make_unique<parallel::PipelineRunner>(*rc.schedule, rc.pp_rank, e.model, links, mb, T,
                                                     cfg.comm.p2p_dtype == FloatFormat::kBf16, &e.memory);
  e.memory.track(e.memory.category("buffers"), pipe_->recv_buffer().data(),
                 int64_t(pipe_->recv_buffer().size() * sizeof(float)));
}

double PipelinePass::run(const MicroBatches& batches, int64_t step, bool flush) {
  Model& model = e_.model;
  e_.begin_step();
  if (sync_) sync_->set_step(step);
  auto arm = [&] {
    if (sync_) sync_->begin(model.grad_buffer());
  };
  if (stream_) stream_->begin_pass();
  // Micro-batch m + i: the next step's i (Note [Vocabulary passes across a step's end]).
  std::unique_ptr<MicroBatches> next;
  auto batch = [&](int micro, int32_t* tok, int32_t* tgt) {
    const int64_t m = batches.count();
    if (micro < m) return batches.fill(micro, tok, tgt);
    if (!next) next = batches.following();
    next->fill(micro - m, tok, tgt);
  };
  const std::optional<parallel::PipelineRunner::Stream> o = stream_ ? stream_->executor(step, flush) : std::nullopt;
  const double loss = pipe_->run_step(batch, batches.shape(0).grad_scale, arm, o ? &*o : nullptr);
  e_.memory.sample();
  if (stream_) stream_->end_pass();
  if (const RankContext& rc = e_.rc; rc.embed && !(stream_ && stream_->sums_tied_itself(flush))) {
    // GPT pipeline: the tied embedding's two copies get the sum of both gradients.
    const ParamSpec& w = model.layout().at("wte");
    rc.embed->all_reduce(std::span<float>(model.grads().data() + w.offset, size_t(w.numel)), comm::ReduceOp::kSum);
  }
  if (sync_) sync_->finish();
  return batches.mean(loss);
}

double PipelinePass::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t, int64_t) {
  return pipe_->forward_only(tokens, targets);
}

void PipelinePass::trace(Trace* t) {
  if (!t) return pipe_->set_step_hook(nullptr);
  const bool chunks = chunks_;
  pipe_->set_step_hook([t, chunks](parallel::Phase phase, int micro, int chunk, bool begin) {
    if (!begin) return t->end();
    std::string name(1, parallel::phase_letter(phase));
    name += std::to_string(micro);
    if (chunks) name.append(".").append(std::to_string(chunk));
    t->begin(name, "pipeline");
  });
}

}  // namespace loom
