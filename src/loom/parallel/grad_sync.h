// Data-parallel gradient synchronisation: bucketed all-reduce (or reduce-scatter for
// ZeRO-2) launched during backward, strictly in bucket order.
//
// Note [Sharded buckets]
// With ZeRO (stage >= 1) every bucket is padded (LayoutPadding) to a multiple of
// dp x 16 floats and split into dp equal pieces; dp rank r owns piece r of every bucket.
// A rank's shard of the flat state is the list of its pieces, so reduce-scatter and
// all-gather run per bucket, and stage 2 keeps the overlap with backward that plain data
// parallel has (Megatron's distributed optimizer shards its buffers the same way). The
// optimizer keeps moments for the owned pieces only.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/comm/group.h"
#include "loom/core/config.h"
#include "loom/core/memory.h"
#include "loom/model/layout.h"
#include "loom/parallel/accordion.h"
#include "loom/parallel/buckets.h"
#include "loom/parallel/compress.h"
#include "loom/parallel/qgz.h"

namespace loom::parallel {

// Where GPT's tied embedding wte goes among the buckets.
enum class WteBucket {
  kShared,     // with its neighbours, like any tensor
  kTiedFirst,  // alone, bucket 0, reduced through Note [Tied embedding reduction]'s hooks
  // Alone, launched last. A GPT pipeline keeps a wte copy on its first and last stage and
  // sums their gradients before the dp reduction; a compressor decides per bucket (top-k's
  // selection, TernGrad's scale), so both copies must sit in the same bucket to get the
  // same update and stay tied.
  kAloneLast,
};

struct DataParallelPlan {
  std::vector<Bucket> buckets;  // launch order; offsets in the padded layout
  bool tied_first = false;      // buckets[0] is wte alone (Note [Tied embedding reduction])
  LayoutPadding padding;        // give to the Model so its layout matches `buckets`
  int dp = 1;
  // Piece `dp_rank` of every bucket, in bucket order (the whole bucket when dp == 1).
  std::vector<FlatRange> owned(int dp_rank) const;
};

// Buckets of model `m`'s flat gradient buffer. `sharded`: pad each bucket to split evenly
// over dp (Note [Sharded buckets]). `wte` (tensor 0): WteBucket. Pure: every rank computes
// the same plan.
DataParallelPlan plan_data_parallel(const ModelConfig& m, int dp, const BucketCaps& caps, bool sharded,
                                    const ModelPart& part = {}, WteBucket wte = WteBucket::kShared);

// Piece `rank` of bucket `b` split evenly over `dp` ranks (Note [Sharded buckets]), flat.
inline FlatRange own_piece(const Bucket& b, int dp, int rank) {
  const int64_t piece = b.count / dp;
  return {b.offset + rank * piece, piece};
}
// Makes everything of bucket `b` outside dp rank `rank`'s piece read zero and leave memory
// (Note [Resident memory]); `base` is the flat buffer.
void release_unowned(const Bucket& b, int dp, int rank, float* base);
// All-gathers every bucket's pieces into the flat buffer `full`. packed == nullptr: the own
// pieces already sit in place in `full`; else they are read from `packed`, in owned() order.
void gather_pieces(comm::Group& dp, const DataParallelPlan& plan, float* full, const float* packed);

// The plan for given buckets (tensor runs in launch order): padding and re-measured ranges.
DataParallelPlan plan_from_buckets(const ModelConfig& m, int dp, bool sharded, const ModelPart& part,
                                   std::vector<Bucket> buckets);

// Note [Unreduced gradients]
// Under ZeRO-2 and 3 (GradSync's kShardEveryMicro) a rank's gradient pages outside its own pieces
// are resident from the moment backward writes them to the moment their bucket's
// reduce-scatter finishes and releases them. Backward writes a block's gradients whole before
// it says they are final (Model's grad-ready hook, once per block, the head's suffix first,
// 0 last); then that block's buckets launch, each waiting for the oldest reduction while
// kShardsInFlight run. So at each hook the rank holds every gradient written since the start
// of the micro-batch less the buckets whose reductions were retired; taking each reduction to
// finish as late as that rule allows (exactly kShardsInFlight still running) bounds the
// peak. GPT's tied wte is written by the head, at the first hook, when the part holds it; in
// a bucket of its own first (plan.tied_first) it is all-reduced whole (Note [Tied embedding
// reduction]) and stays. The engine's memory estimate counts this peak's non-owned
// share (Note [Part memory estimates]). The bound takes every reduction to end as late as
// the rule allows; under ZeRO-3, whose buckets are whole blocks, they end earlier and the
// bound is up to 12 MiB (40%) above the measured peak on small models (docs/log).
// The peak floats, over the layout `specs` of the plan's buckets; `head_writes_wte`: GPT's
// tied wte (specs[0]) in a part that holds the head.
int64_t unreduced_peak_floats(const DataParallelPlan& plan, const std::vector<ParamSpec>& specs, bool head_writes_wte);

class GradSync {
 public:
  // kAllReduce (stage 0) and kReduceScatter (stage 1, and stage 2 in a pipeline) run on the
  // last micro-batch of a step and average. kShardEveryMicro (stage 2/3) runs on every
  // micro-batch and sums: each own piece accumulates the reduced sums while the rest of
  // the buffer is released back to zero after each reduction (Note [Resident memory]),
  // so a rank never keeps more than one micro-batch of unreduced gradients; the last
  // micro-batch's finish divides the own pieces by dp. At most kShardsInFlight reductions
  // run at once (a bucket waits for the oldest before it starts), so the unreduced
  // gradients resident are at most those buckets' and the one backward is filling.
  static constexpr size_t kShardsInFlight = 2;
  enum class Mode { kAllReduce, kReduceScatter, kShardEveryMicro };
  // `compression`: the payload of the gradient all-reduces or reduce-scatters (comm.grad_dtype,
  // parallel.compress = bf16 | int8; Note [Compressed all-reduce], Note [Ring codecs]).
  GradSync(comm::Group& dp, const DataParallelPlan& plan, Mode mode,
           comm::Compression compression = comm::Compression::kNone);

  // Stateful compressors (Note [Gradient compressors]), one per bucket, over the model's
  // layout `specs` (shapes of the bucket's tensors). Call before training.
  void set_compressors(const CompressSpec& spec, const std::vector<ParamSpec>& specs);
  // The optimizer step about to be computed: before spec.warmup_steps the exact all-reduce
  // runs (overlapped with backward), from then on the compressors, after backward.
  void set_step(int64_t step);
  bool compressing() const { return sync_ != StepSync::kExact; }
  // 1-bit Adam past its warm-up (Note [1-bit Adam]): finish() leaves each rank's own
  // gradients, and the optimizer calls reduce_update on its preconditioned momentum (in
  // the gradient buffer) instead. Collective over dp.
  bool local_gradients() const { return sync_ == StepSync::kLocal; }
  const CompressSpec& spec() const { return spec_; }
  void reduce_update(float* u);
  // Zeroes every compressor's state (0/1 Adam's residuals change units between its phases).
  void reset_compressor_state();
  // Bytes one step's gradient reduction puts on the wire from this rank (ring all-reduce:
  // 2 (dp - 1) / dp of the payload; Note [Gradient compressors] for the rest), and the
  // same for the exact fp32 all-reduce of the same buckets.
  double wire_bytes() const;
  double exact_wire_bytes() const;
  // wire_bytes() averaged over the steps finished so far (warm-up and Accordion's settings
  // change it from step to step).
  double mean_wire_bytes() const { return steps_ ? wire_sent_ / double(steps_) : wire_bytes(); }
  const std::vector<std::unique_ptr<BucketCompressor>>& compressors() const { return compressors_; }
  // Accordion (Note [Accordion]) when spec.accordion, else null; its switches since the last call.
  Accordion* accordion() { return accordion_.get(); }
  std::vector<std::string> take_accordion_log() { return accordion_ ? accordion_->take_log() : std::vector<std::string>{}; }

  // ZeRO++ qgZ (Note [qgZ]): the reduce-scatter modes send int8 blocks by all-to-all.
  void set_qgz(bool on);
  // ZeRO-1 keeps its gradient buffer whole: a compressed step's finish() does not hand back
  // the pieces this rank does not own (Note [Compressed ZeRO-2/3]).
  void keep_unowned(bool keep) { keep_unowned_ = keep; }
  // Keep the bucket holding tensor 0 (wte) until finish(): a GPT pipeline first sums the
  // tied embedding's two copies (first and last stage) before it is reduced.
  void hold_first_tensor(bool hold) { hold_first_ = hold; }
  // Arms the sync for the micro-batch whose backward is about to run (the last of the
  // step; earlier ones only accumulate). `grads` is the model's flat gradient buffer.
  void begin(float* grads);
  // The model's grad-ready hook: launches, in bucket order, every bucket whose tensors
  // all have index >= first_final. Does nothing unless armed.
  void on_ready(int first_final);
  // Note [Tied embedding reduction]: the model's tied-embedding hooks. head_done launches
  // bucket 0 (wte alone: the head's dense gradient plus earlier micro-batches') as backward
  // starts. embedding() takes the last micro-batch's embedding rows instead of letting the
  // model scatter them into wte: it gathers every dp rank's (tokens, rows) - N x C floats,
  // against V x C for wte - and adds them, scaled by 1/dp, in rank order, after bucket 0's
  // all-reduce, so every rank ends with the same average. Then the biggest tensor of GPT
  // no longer waits for the very end of backward. Under ZeRO-1 bucket 0 is reduce-scattered
  // and the rows are added to the own piece only, the part of wte the rank's update reads.
  // Returns false when not armed.
  void on_tied_head_done();
  bool on_embedding_rows(const int32_t* tokens, const float* rows, int64_t n, int64_t C);
  // Launches what is left, waits for every bucket and disarms. `last_micro`: the step's
  // last micro-batch (kShardEveryMicro scales its pieces then).
  void finish(bool last_micro = true);
  bool every_micro() const { return mode_ == Mode::kShardEveryMicro; }
  // Sampled whenever a bucket is launched and at finish.
  void set_tracker(MemoryTracker* t) { tracker_ = t; }

  // Times each bucket's reduction alone (median of 3, on scratch memory; collective over
  // the dp group) as the yardstick of Note [Overlap]. Call before training.
  void measure_standalone();
  double standalone_s() const { return standalone_s_; }  // one step's reductions, run alone
  // Share of the reduction time backward hid, over every step so far (Note [Overlap]).
  // Collective over the dp group (ranks compare when each finished backward).
  double hidden_fraction();
  // Seconds this rank's reductions ran on after the last dp rank finished backward.
  double exposed_wait_s() const { return exposed_s_; }

 private:
  comm::Group& dp_;
  const DataParallelPlan& plan_;
  Mode mode_;
  comm::Compression compression_;
  std::vector<std::unique_ptr<BucketCompressor>> compressors_;
  std::unique_ptr<Accordion> accordion_;
  CompressSpec spec_;
  std::vector<ParamSpec> specs_;
  int64_t step_ = 0, steps_ = 0;
  double wire_sent_ = 0;
  StepSync sync_ = StepSync::kExact;  // this step's (set_step)
  double ring_wire_bytes(CompressKind codec) const;
  MemoryTracker* tracker_ = nullptr;
  float* grads_ = nullptr;
  size_t next_ = 0;
  bool hold_first_ = false, finishing_ = false, keep_unowned_ = false;
  std::vector<comm::Work> pending_;
  std::vector<size_t> pending_bucket_;   // bucket of each pending_ entry
  bool qgz_ = false;
  std::vector<std::unique_ptr<QgzScatter>> qgz_pending_;  // per pending_ entry under qgZ
  void complete(size_t i);  // waits for pending_[i] (and finishes its qgZ sum)
  comm::Work reduce_bucket(const Bucket& b);  // starts b's all-reduce or reduce-scatter
  size_t released_ = 0;                  // kShardEveryMicro: pending_[0, released_) handed back
  void release_done(size_t running);  // 0: waits for them all
  // Per step: ledger time when backward ended and when the last bucket finished.
  struct Window {
    double begin_us, backward_end_us, done_us;
  };
  std::vector<Window> windows_;
  double begin_us_ = 0, exposed_s_ = 0, standalone_s_ = 0;
};

}  // namespace loom::parallel
