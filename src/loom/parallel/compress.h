// Compressed data-parallel gradients: one compressor per bucket, with its own state.
//
// Note [Gradient compressors]
// parallel.compress picks how a bucket's gradient crosses the dp group. Every compressor
// ends with the same bits on every rank: the messages are exchanged whole (all-gather or
// all-reduce of the compressed form) and decoded and summed in rank order.
//   none      exact fp32 ring all-reduce, launched during backward (the reference).
//   bf16/int8 codecs of that ring (Note [Compressed all-reduce]): stateless, overlapped.
//   topk      DGC (Lin et al., ICLR 2018): v += g (with its momentum correction,
//             u = m u + g, v += u); send the k = ceil(ratio n) entries of largest |v|
//             as (index, value) pairs in one sparse all-gather; the sent entries of v (and
//             u) are zeroed (error feedback / momentum factor masking), so
//             sent + new v == g + old v holds bit for bit.
//   terngrad  TernGrad (Wen et al., NeurIPS 2017): g clipped to +-2.5 sigma (its gradient
//             clipping), shared scale s = max over ranks of max|g| (its scaler sharing),
//             t = s sign(g) b, b ~ Bernoulli(|g| / s), from a counter-based stream of (seed, step,
//             bucket, rank, index); unbiased, no residual. The ternary values travel as 2-bit
//             codes in an all-gather up to dp 8, beyond as an all-reduce of int8 sums
//             (terngrad_gathers); dp <= 127.
//   powersgd  PowerSGD (Vogels et al. 2019, Alg. 1): per matrix M = G + E (E the residual),
//             P = M Q, all-reduce P, orthogonalise P, Q = M^T P, all-reduce Q, G' = P Q^T,
//             E = M - G'. Q is warm-started from the previous step (one power iteration per
//             step) and starts as the same seeded Gaussian on every rank. Vectors and
//             matrices that would not shrink 2x go in one exact fp32 all-reduce per bucket.
// The three stateful compressors run bucket by bucket after backward (blocking
// collectives, not overlapped with backward; a later slice chains them on the comm
// worker). parallel.compress_warmup_steps runs the exact all-reduce first (residuals
// untouched). They need a gradient scale that does not change between steps (no fp16 loss
// scaling); config validation refuses the rest.
//
// Note [Compressed ZeRO-2/3]
// Under ZeRO-1/2/3 a compressed step reduces whole buckets as ZeRO 0 does and then keeps
// each rank's piece: the step's micro-batches accumulate the full gradient (no per-micro
// reduce-scatter), the compressors (and Adasum) reduce each bucket once at the step's end,
// and under ZeRO-2/3 the pieces a rank does not own are handed back (Note [Resident memory];
// ZeRO-1 keeps its buffer whole). So the compressor's arithmetic, residuals and bits are ZeRO
// 0's, and ZeRO-1/2/3 differ from it only in the optimizer's and the parameters' sharding; the
// gradient buffer is whole during the step, as ZeRO 0's is. Exact (warm-up) steps
// reduce-scatter as usual (ZeRO-1 at the last micro-batch). The bf16 and int8
// codecs instead run in the reduce-scatter itself (Note [Ring codecs]).
//
// Note [1-bit Adam]
// parallel.compress = onebit_adam is 1-bit Adam (Tang et al., "1-bit Adam: Communication
// Efficient Large-Scale Training with Adam's Convergence Speed", ICML 2021, Algorithm 1), an
// optimizer mode: parallel.compress_warmup_steps T_w exact AdamW steps (default: the larger
// of 15% of train.steps and optim.warmup_steps, onebit_default_warmup), then v is frozen, D = sqrt(v / (1 - b2^T_w)) + eps with it, and each step
// every rank i, from its own (clipped) gradient g_i and the shared momentum m:
//   u_i = (b1 m + (1 - b1) g_i) / D     its momentum, preconditioned
//   u   = CompressedAllReduce(u_i)     the same bits on every rank
//   m   = u D;  p -= lr (u / (1 - b1^t) + wd p)
// which is AdamW's step with v frozen when the all-reduce is exact. The gradients are never
// all-reduced. loom compresses the preconditioned momentum u where the paper compresses m:
// D is frozen and the same on every rank, so the exact mean is the same, but a sign
// compressor gives each entry of a chunk the chunk's rms, and for m that sends an entry
// whose v is tiny (GPT's key bias, whose gradient is rounding noise: softmax ignores it)
// the rms of the whole tensor divided by its tiny D. On loom verify's tiny run that blew
// weights up by 20-60 (m compressed) where u stays within 0.13 (same loss distance).
// CompressedAllReduce, per bucket over P ranks, per tensor (one scale per tensor chunk, as
// DeepSpeed compresses per parameter tensor; alignment padding is left out): chunk j of
// every tensor goes to rank j. Worker: y = x + e_w, C(y) = rms(y) sign(y) (sign(0) = +1),
// e_w = y - C(y); signs as bits plus the scale, all-to-all. Server j: the mean of the P
// decoded chunks in rank order, z = mean + e_s, C(z), e_s = z - C(z), all-gathered and
// decoded by every rank. Each hop sends 1/32 of fp32's bytes plus the scales: about 32x
// fewer than the exact ring. The residuals e_w (a bucket) and e_s (the served chunks) are
// checkpointed. The norm for clipping is the root mean square of the ranks' local norms
// (no gradient is reduced to measure the global one), one coefficient on every rank.
//
// Note [Compressed Adam with ZeRO]
// Under ZeRO-1/2/3 (parallel.zero >= 1) each rank keeps m and v for its own pieces only
// (Note [Sharded buckets]), so no rank can form its whole momentum u_i = (b1 m + (1 - b1)
// g_i) / D, which ZeRO 0 compresses. What crosses instead is the preconditioned gradient:
//   w_i = g_i / D                      D whole on every rank (frozen, gathered once)
//   w   = CompressedAllReduce(w_i)     the same bits on every rank (whole buckets)
//   m   = b1 m + (1 - b1) w D;  p -= lr (m / D / (1 - b1^t) + wd p)   own pieces
// then ZeRO-1/2 all-gather p as after any update (ZeRO-3 keeps its pieces). With an exact
// mean this is ZeRO 0's step up to rounding ((g / D) D is not g; tested: top-k Adam at ratio 1
// under ZeRO-1/2/3 holds the exact layouts' bounds against ZeRO 0). The compressors (1-bit's
// signs with worker and server error feedback, top-k with its residual) run on whole buckets
// as in Note [Compressed ZeRO-2/3], and their residuals then hold units of g / D (error
// feedback on the preconditioned gradient, as 0/1 Adam's compressed steps send g / D).
// Memory: the momentum and the variance are sharded; D (4 bytes a parameter) and the worker
// residual stay whole; measured against the exact run in train/verify.h. 0/1 Adam is refused
// with ZeRO: its local steps update every parameter from each rank's own momentum.
//
// Note [Top-k Adam]
// parallel.compress = topk_adam runs 1-bit Adam's frame (Note [1-bit Adam]: the exact
// warm-up, v frozen, the preconditioned momentum u_i crossing the dp group, m = u D) with
// DGC's top-k (the topk compressor: the k = ceil(ratio n) largest |u_i + e_i| as (index,
// value) pairs, error feedback e_i, no server stage) in place of the signs. Why: topk on the
// gradients under AdamW learns about sqrt(1 / ratio) times too slowly (docs/log/benchmarks.md,
// "TernGrad and top-k over the 300 steps"): a coordinate sent once every K steps
// carries K gradients, which Adam's second moment sees as one (K g)^2, so it moves lr sqrt(K)
// per K steps where exact Adam moves lr K. With v frozen the update is linear in what is
// sent, as SGD's is, so a delayed coordinate arrives whole, the case DGC's error feedback is
// made for. A coordinate not sent has m = 0 on that step and its momentum waits in e_i
// (undecayed, as DGC's momentum correction keeps it). parallel.compress_momentum must be 0
// (the optimizer's momentum is the momentum); the ratio is topk's (parallel.compress_ratio).
//
// Note [0/1 Adam]
// parallel.compress = zero_one_adam is 0/1 Adam (Lu et al., "Maximizing Communication
// Efficiency for Large-scale Training via 0/1 Adam", ICLR 2023; the schedule as DeepSpeed's
// ZeroOneAdam runs it). No exact warm-up; two phases over the 1-based optimizer step t:
//  - t <= T_v (zero_one_var_freeze_steps, default optim.warmup_steps): adaptive variance
//    freezing. v updates only on variance steps, t % I == 0 with I starting at 1 and doubling
//    after every kappa (zero_one_var_scaler) updates; those steps all-reduce the gradients
//    exactly, the others send g / D through the compressed all-reduce of Note [1-bit Adam]
//    and use its mean times D, D = sqrt(v / (1 - b2^k)) + eps (k the variance updates so far;
//    0 where v is 0); m updates every step; p moves by AdamW's rule with bias corrections
//    1 - b1^t and 1 - b2^k.
//  - t > T_v: 1-bit local steps. Gradients stay local; each rank takes AdamW steps with v
//    frozen from its own gradients; every J steps (J starts at 1 and doubles every
//    zero_one_local_scaler steps up to zero_one_local_clip = H) the ranks synchronise: each
//    sends its move since the last synchronisation, d = p - p_sync, through the compressed
//    all-reduce, then p = p_sync + mean(d) (the same bits on every rank), p_sync = p, and
//    m = -mean(d) D / (sum of lr / (1 - b1^t) since), m's lr-weighted mean (the weight
//    decay in d leaves wd p D in it, as in DeepSpeed, whose wd defaults to 0).
//    A step that saves a checkpoint, validates or ends the run always synchronises, so
//    checkpoints and validation see one model and a resume is exact.
// loom sends g / D where DeepSpeed sends g, and the move d in parameter units where it sends
// d D, for the reason 1-bit Adam sends u (Note [1-bit Adam]): signs scaled by a tensor chunk's
// rms are noise of that size on every entry, and divided by a tiny D (GPT's key bias) they
// move weights by thousands (measured: 251 on loom verify's run, 0.0xx this way). It keeps
// p_sync (one parameter copy) so the replicas meet bit for bit instead of rolling back by
// subtraction. The compressor's residuals are zeroed at the first local step: they change
// units there (DeepSpeed resets its error buffers at the freeze as well).
//
// Note [Adasum]
// parallel.reduce = adasum combines the dp ranks' gradients by Adasum (Maleki et al., "Scaling
// Distributed Training with Adaptive Summation", MLSys 2021), per tensor:
//   Adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b,
// so orthogonal gradients add and identical ones average. Over 2^k ranks it is applied along
// a binary tree of rank order ((0,1), (2,3), then their results, ...), computed by vector
// halving, distance doubling (as Horovod's Adasum does): at distance d each rank
// swaps half of its current piece with rank ^ d, the lower rank's data being a; the partial
// dot products and squared norms of its half, in fp64 per tensor, are all-gathered over the
// dp group and summed in rank order over the 2d ranks sharing the tree node, so those ranks
// use the same coefficients; after log2(dp) levels each rank holds 1/dp of the result, and
// one all-gather assembles it: the same bits everywhere. Runs after backward like the
// stateful compressors; dp must be a power of two.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/group.h"
#include "loom/core/config.h"
#include "loom/model/layout.h"
#include "loom/parallel/buckets.h"
#include "loom/parallel/compress_traffic.h"
#include "loom/rank/compress_spec.h"

namespace loom::parallel {

// The spec and its step schedule live in the pure plan library (rank/compress_spec.h).
using StepSync = rank::StepSync;
using CompressSpec = rank::CompressSpec;
using rank::compress_spec;
// bf16 / int8: a codec of the ring all-reduce (kNone otherwise).
comm::Compression ring_codec(const CompressSpec& spec);

// A named state buffer of a compressor (checkpointed with the rank's shard).
struct CompressorState {
  std::string name;
  std::vector<float>* data;
};

class BucketCompressor {
 public:
  virtual ~BucketCompressor() = default;
  // g: this rank's gradient of the bucket. Returns with g = the dp mean of every rank's
  // decompressed message, the same bits on every rank. Collective over dp.
  virtual void reduce(comm::Group& dp, std::span<float> g, int64_t step) = 0;
  // Bytes one reduce puts on the wire from this rank at the current setting
  // (CompressTraffic::wire_bytes).
  double wire_bytes() const { return traffic_[heavy_].wire_bytes(dp_); }
  virtual std::vector<CompressorState> state() { return {}; }
  // Accordion: the heavy (true) or the light setting for the next reduce.
  void set_heavy(bool heavy) {
    heavy_ = heavy;
    on_setting(heavy);
  }
  bool heavy() const { return heavy_; }

 protected:
  virtual void on_setting(bool) {}

 private:
  friend std::unique_ptr<BucketCompressor> make_compressor(const CompressSpec&, const Bucket&,
                                                           const std::vector<ParamSpec>&, int);
  CompressTraffic traffic_[2];  // light, heavy
  bool heavy_ = false;
  int dp_ = 1;
};

// The compressor of `bucket` (in the layout of `specs`) for a dp group of `dp` ranks. Its
// random streams (TernGrad's rounding, PowerSGD's first Q) are keyed by the name of the
// bucket's first tensor, so a bucket holding the same tensors on two pipeline stages (GPT's
// tied wte, WteBucket::kAloneLast) draws the same numbers on both.
std::unique_ptr<BucketCompressor> make_compressor(const CompressSpec& spec, const Bucket& bucket,
                                                  const std::vector<ParamSpec>& specs, int dp);

}  // namespace loom::parallel
