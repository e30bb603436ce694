// A run's gradient-compression spec and its step schedule, from the config alone (issue 52's
// plan library: the engine's gradient sync and optimizer, the checkpoint of compressor state
// and the simulator read the same spec). The compressors themselves are parallel/compress.h
// (Note [Gradient compressors]); 0/1 Adam's schedule is Note [0/1 Adam] there.
#pragma once

#include <cstdint>

#include "loom/core/config.h"

namespace loom::rank {

// What a step's gradients do across the dp group (CompressSpec::sync_at).
enum class StepSync {
  kExact,       // the exact all-reduce (or the ring codec), overlapped with backward
  kCompressed,  // the bucket compressors, after backward
  kLocal,       // nothing: the optimizer mode reduces what it needs (1-bit / 0/1 Adam)
};

struct CompressSpec {
  CompressKind kind = CompressKind::kNone;
  double ratio = 0.001;      // topk: fraction of each bucket sent (DGC: 99.9% sparsity)
  double momentum = 0.0;     // topk: DGC momentum correction factor (0: plain error feedback)
  int64_t rank = 4;          // powersgd: approximation rank
  int64_t warmup_steps = 0;  // optimizer steps reduced exactly before compressing
  uint64_t seed = 0;         // terngrad's rounding stream, powersgd's initial Q
  bool adasum = false;       // parallel.reduce = adasum (with kind kNone)
  // onebit_adam (Note [1-bit Adam]): the optimizer reduces the momentum, not GradSync the gradients.
  bool in_optimizer() const { return compress_in_optimizer(kind); }
  // 0/1 Adam (Note [0/1 Adam]): its schedule, and the steps that must synchronise (every
  // save_every-th, val_every-th and the last of train_steps; 0 = none).
  int64_t var_freeze = 0, var_scaler = 16, local_scaler = 32678, local_clip = 16;
  int64_t train_steps = 0, save_every = 0, val_every = 0;
  // The 0-based optimizer step `step`'s sync.
  StepSync sync_at(int64_t step) const;
  // 0/1 Adam: does step update v (a variance step), how many variance updates steps
  // 0..step made, and does a local step synchronise the parameters.
  bool variance_step(int64_t step) const;
  int64_t variance_updates(int64_t step) const;
  bool local_sync(int64_t step) const;
  // Accordion (Note [Accordion]): rank / ratio above are the light setting, these the heavy.
  bool accordion = false;
  int64_t heavy_rank = 1;
  double heavy_ratio = 0.0001;
  int64_t window = 100;
  double eta = 0.5;
  // topk, terngrad, powersgd, onebit_adam: compressors with state.
  bool stateful() const { return compress_has_state(kind); }
  // Run by a BucketCompressor after backward: the stateful compressors and Adasum.
  bool post_backward() const { return stateful() || adasum; }
};

// parallel.compress and its parameters (comm.grad_dtype = bf16 is the same as
// parallel.compress = bf16).
CompressSpec compress_spec(const Config& cfg);

}  // namespace loom::rank
