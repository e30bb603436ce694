// PipeDream-2BW in the engine (Note [PipeDream-2BW] in parallel/schedule.h): the second
// weight version, the pending gradient, and which gradients each step's end applies.
//
// In a 2bw pipeline (pp >= 2) step t runs the previous step's trailing backwards on W(t-2)
// (the stash) and its own forwards and backwards on W(t-1) (the parameters). The gradient
// buffer carries over between steps (the trailing backwards finish the previous step's
// gradient); before the step's first own backward that complete gradient moves to the
// pending buffer. At the step's end: stash <- W(t-1), then W(t) = AdamW(W(t-1), pending).
// Note [Early stash]: nothing reads the stash between the step's last trailing backward and
// the next step's first, so a pipeline stage writes W(t) = AdamW(W(t-1), pending) into the
// stash from then on, in pieces, and at the step's end takes the stash as its parameters and
// its parameters (W(t-1)) as the stash, by exchanging the buffers: no copy at the step's end,
// where the first stage's work delays its next forwards, which the last stage waits for
// (config M at pp 2: the copy that stood there took 10-31 ms in slow runs; Note [2BW's update
// in the waits] in modes/stream/two_bw_update.cc). The last stage runs each micro-batch's
// backward right after its forward, in its own step (its lag is 0 under every lag rule, Note
// [Vocabulary passes ahead]), so it never reads a stash and holds none (stream_param_copies):
// two of its five passes a step over its parameters saved, on the stage that holds the head
// and, in a GPT, the tied table; it updates in place at the step's end.
// Under pp_vocab a step that runs the next step's first forwards exchanges the buffers just
// before the first of them instead (Note [The next step's first forwards ahead] in
// parallel/schedule.h), and updates its vocabulary tensors aside until its last head is done,
// on a stage with a stash into the stash's rows.
// A flushing step also finishes its own gradient (the cool-down backwards) and applies it
// after the pending one; the next step starts the stream again. Under pp_vocab the tensors the
// vocabulary passes add to (Model::vocab_range()) complete apart: the step's first pass moves
// their gradient to the pending buffer and the trailing embedding gradients it carries are
// added there (Note [Vocabulary passes in a stream] in parallel/schedule.h).
//
// The reference (TrainOptions::two_bw_reference: one process, or a flushing pipeline of the
// same layout) applies the same updates in the same order with the same values, one step
// earlier in wall time: step t
// computes on the stash (W(t-1); the parameters themselves on a stream's first step), then
// stash <- W(t) and W(t+1) = AdamW(W(t), g(t)); a flushing step leaves no stash.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "loom/core/config.h"
#include "loom/core/memory.h"
#include "loom/model/model.h"
#include "loom/modes/stream/stream_part.h"
#include "loom/parallel/pipeline.h"
#include "loom/train/trace.h"

namespace loom {

class TwoBwState final : public StreamPart {
 public:
  // pipeline: this rank runs a 2bw pipeline stage, holding a stash when `stash`
  // (stream_param_copies); otherwise the single-process reference (always a stash).
  TwoBwState(Model& model, MemoryTracker& memory, bool pipeline, bool stash = true);

  // The step's gradients start at zero (the reference's always; a pipeline's when its step
  // starts the stream, else they carry the previous step's over).
  bool starts_stream() const { return !pipeline_ || !started_; }
  bool carries_gradients() const override { return !starts_stream(); }
  // Pipeline: the executor's part of a step.
  std::optional<parallel::PipelineRunner::Stream> executor(int64_t step, bool flush) override;
  // Reference: computes the step on the stash (when there is one) until end_pass(); no-ops
  // for a pipeline.
  void begin_pass() override;
  void end_pass() override;
  // This step's gradient is complete only on a flush; the pending one's wte sum is taken as
  // it completes (Note [2BW without a barrier]).
  bool sums_tied_itself(bool flush) const override { return pipeline_ && !flush; }
  // The gradients complete at this step's end, in the order they are applied, each with the
  // step whose batch made it (its learning rate).
  struct Update {
    std::vector<float>* grads;
    int64_t batch;
  };
  std::vector<Update> updates(int64_t step, bool flush);
  // Around the updates of a step's end.
  void before_updates(bool flush);
  void after_updates(bool flush);
  // Note [2BW's update in the waits]: a stage with a stash, between flushes, writes the pending
  // update into the stash (W(t-1) read from the parameters), then at the step's end takes the
  // stash as its weights (take_stash_as_params: the buffers exchanged, the vocabulary rows
  // copied over); the pending gradient's batch (its learning rate).
  bool updates_into_stash(bool flush) const;
  std::vector<float>& stash() { return stash_; }
  std::vector<float>& pending() { return pending_; }
  int64_t pending_batch() const { return pending_batch_; }
  void take_stash_as_params();

  // Note [Measured bubble]: the update rule's work inside the stream - the gradient's move to
  // the pending buffer, its squares, the stash copy and AdamW of a step that does not flush -
  // traced as "U" spans of category "update", so a rank's time in it counts as busy, as
  // pipedream's per-minibatch updates do. A flushing step updates after its drain, as 1F1B.
  // A piece written in a wait (Note [2BW's update in the waits]) is named "U wait".
  [[nodiscard]] Spans::Scope update_scope(bool flush, const char* name = "U") const {
    return Spans(flush ? nullptr : trace_).open(name, "update");
  }
  void trace(Trace* t) override { trace_ = pipeline_ ? t : nullptr; }

  bool pipeline() const override { return pipeline_; }
  // Pipeline: called with the pending gradient as soon as it is complete (mid-step), so its
  // norm can be summed over the ranks while the step goes on (Note [2BW without a barrier]).
  std::function<void(std::vector<float>& pending)> on_pending;
  // Pipeline: called after each backward (the deferred norm's poll, Note [2BW without a barrier]).
  std::function<void()> on_backward;
  // Pipeline, a stage with a stash between flushes: called before each backward's receive once
  // the pending gradient is complete, with the step's backwards left (Note [2BW's update in the
  // waits]).
  std::function<void(int left)> on_wait;
  // Pipeline, under pp_vocab: called in step `step`'s pass that updates the vocabulary tensors
  // (the pending gradient's leading vocab_floats()) with the pending gradient (Note [Vocabulary
  // passes across a step's end] in parallel/schedule.h); the step's end then updates the rest.
  // `aside`: into that buffer (laid out as the leading vocab_floats() of the parameters), not the
  // parameters (Note [The next step's first forwards ahead]).
  std::function<void(std::vector<float>& pending, int64_t step, std::vector<float>* aside)> on_vocab_update;
  int64_t vocab_floats() const { return vocab_; }
  // Pipeline, a stage with a stash: called before the next step's first forward when this step
  // runs it (Note [The next step's first forwards ahead]): the rest of the stash written and
  // taken as the weights (take_stash_as_params), which the step's end then leaves as they are.
  std::function<void()> on_ahead;
  bool stash_taken() const { return stash_taken_; }

 private:
  void bind(bool previous);
  void vocab_hooks(parallel::PipelineRunner::Stream& o, int64_t step);

  Model& model_;
  bool pipeline_;
  std::vector<float> stash_;    // the other weight version (laid out as the parameters); none on the last stage
  std::vector<float> pending_;  // pipeline: the previous step's complete gradient
  // The pending gradient's two parts (Note [Vocabulary passes in a stream]): the leading
  // vocab_ floats the vocabulary passes add to (0 without pp_vocab) and the rest, each complete.
  void complete_part();
  int64_t vocab_ = 0;
  int parts_done_ = 0;
  bool started_ = false;        // the previous step did not flush
  bool has_pending_ = false;
  bool stash_valid_ = false;    // reference: the step computes on the stash
  bool bound_previous_ = false;  // pipeline: the stash is bound
  bool flush_ = false;           // pipeline: the step running flushes
  bool stash_taken_ = false;     // this step took the stash as its weights already
  // Note [The next step's first forwards ahead]: W(t)'s vocabulary tensors, written by an `aside`
  // update and read by the next step's lookups until the step's `take` copies them over.
  std::vector<float> aside_;
  bool aside_live_ = false;
  // A stage with a stash writes them into the stash's rows instead (no copy, no take), and its
  // take pass's head reads W(t - 1)'s from the stash once the exchange made them its.
  bool vocab_in_stash_ = false;
  MemoryTracker& memory_;
  int64_t pending_batch_ = -1;   // pipeline: the batch the pending gradient is of
  Trace* trace_ = nullptr;       // pipeline: Note [Measured bubble]
};

}  // namespace loom
