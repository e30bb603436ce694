// Variable-length batches: one document per row, rows of similar length together.
//
// Note [Length bucketing]
// MXNet's BucketingModule trains each batch at the length of its bucket instead of one
// fixed length; the megabatch trick (HF Trainer's group_by_length, fairseq's
// batch_by_size) keeps batches random while grouping lengths. Here:
//  - Samples. The token stream's end-of-document tokens cut it into documents; document d
//    is the target positions (e_{d-1}, e_d] (the first document starts at position 1), so
//    its first input is the previous document's end token, acting as a beginning-of-text
//    token. A document longer than seq targets is cut into pieces of seq. Every position
//    but 0 is the target of exactly one sample, once per epoch.
//  - Order. Global sample g of the stream is sample permute(g mod S, S, key(seed, g div S))
//    (Note [Epoch order]). Megabatch k holds stream positions [k P B, (k+1) P B) (P =
//    data.bucket_pool, B = the global batch), sorted by length, longest first (ties by
//    position), and cut into P global batches; step s reads batch permute(s mod P, P,
//    key(seed, k)) of megabatch k = s div P. So a step's B samples have similar lengths,
//    the steps of a megabatch visit the lengths in random order, and the global batch is
//    a function of the step alone (any layout, any resume).
//  - Rows. The global batch (longest first) is cut into grad_accum groups of B / accum
//    consecutive rows: micro-batch m of every rank comes from group m; inside a group dp
//    rank k takes rows k, k + dp, ... so the ranks' lengths match (no rank waits for a
//    longer one). A micro-batch is padded to its bucket: the smallest of the lengths
//    ceil(i seq / data.buckets), i = 1..buckets, that holds its longest row (by default
//    multiples of 8: few shapes, each a multiple of the vector width), rounded up to a
//    multiple of 2 cp (cp with the plain split) under context parallelism, so each cp rank
//    holds its equal chunks of it; padded positions have target kPadTarget (the kernels'
//    kIgnoreTarget).
//  - Loss. Step loss = (sum of the real targets' losses) / R, R = the global batch's real
//    target count (known to every rank from the plan, no communication), so any split
//    over micro-batches and dp ranks gives exactly the gradient of one big batch.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/data/source.h"

namespace loom::data {

// The target of a padded position: the kernels' kIgnoreTarget (loss 0, no gradient).
inline constexpr int32_t kPadTarget = -1;

struct Sample {
  uint64_t first_target = 0;  // targets [first_target, first_target + length); inputs one earlier
  uint32_t length = 0;        // 1 .. seq
};

// The samples of `src` in stream order: documents ended by `end_token`, cut at `seq`
// targets. Reads the stream once (O(tokens)); 16 bytes per sample are kept.
std::vector<Sample> document_samples(const TokenSource& src, int32_t end_token, int64_t seq);

struct BucketOptions {
  int64_t seq = 0;      // the longest row
  int64_t buckets = 1;  // padded lengths ceil(i seq / buckets), i = 1..buckets
  int64_t pool = 16;    // global batches per sorted megabatch (1: no length grouping)
  uint64_t seed = 0;
  int64_t multiple = 1;  // padded lengths rounded up to a multiple of this (seq is one)
};

// One micro-batch of one rank: which samples, padded to what length.
struct MicroPlan {
  std::vector<Sample> rows;
  int64_t seq = 0;  // padded length (a bucket)
};

class BucketPlan {
 public:
  // Throws loom::Error when there are no samples or the options are out of range.
  BucketPlan(std::vector<Sample> samples, const BucketOptions& opt);

  // The B samples of step `step`'s global batch, longest first.
  std::vector<Sample> global_batch(int64_t step, int64_t B) const;
  // Micro-batch `micro` of `accum` on dp rank `rank` of `dp` (B % (accum dp) == 0).
  MicroPlan micro_batch(const std::vector<Sample>& batch, int64_t micro, int64_t accum, int rank, int dp) const;
  // The smallest bucket length >= `length`.
  int64_t bucket_length(int64_t length) const;
  int64_t sample_count() const { return int64_t(samples_.size()); }

 private:
  std::vector<Sample> samples_;
  BucketOptions opt_;
};

// Fills (rows.size(), plan.seq) tokens and targets of one micro-batch from `src`: sample
// inputs, then `pad_token` inputs with kPadTarget targets.
void fill_micro_batch(const TokenSource& src, const MicroPlan& plan, int32_t pad_token, int32_t* tokens,
                      int32_t* targets);

}  // namespace loom::data
