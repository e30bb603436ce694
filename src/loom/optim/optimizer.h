// AdamW over the flat parameter buffer, global grad-norm clipping, and the LR schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "loom/core/bf16.h"
#include "loom/core/config.h"
#include "loom/kernels/kernels.h"
#include "loom/model/layout.h"

namespace loom {

class StateFile;

// Linear warmup from lr/warmup to lr over warmup_steps, then cosine decay to lr*min_lr_ratio
// at total_steps. `step` is 0-based (the step about to be taken).
double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps);

// Scales grads so their global L2 norm is at most max_norm, exactly as
// torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1.
// Returns the norm before clipping. max_norm <= 0 only measures.
double clip_grad_norm(const Kernels& k, std::vector<float>& grads, double max_norm);

// Note [Norm pieces]
// Sums of squares run over pieces: each range cut at every multiple of kNormPiece elements
// of the flat buffer, one kernel call per piece (the kernel's threads split a piece, so the
// rounding depends only on the piece), added in offset order into one double. A pass that
// holds the buffer a whole number of pieces at a time (gradient chunks, Note [Gradient
// chunks]) makes the same additions in the same order, hence the same bits.
inline constexpr int64_t kNormPiece = int64_t(1) << 18;  // 1 MiB of floats
// s += the squares of x over r, piece by piece.
void add_sum_squares(const Kernels& k, const float* x, const FlatRange& r, double& s);
// Sum of squares over some ranges of a flat buffer (a ZeRO shard's pieces), in order.
double sum_squares(const Kernels& k, const float* x, const std::vector<FlatRange>& ranges);
// Clipping coefficient as clip_grad_norm applies it: max_norm / (norm + 1e-6) when that
// is < 1 (and max_norm > 0), else 1.
double clip_coef(double norm, double max_norm);

// Contiguous runs of the whole flat buffer sharing one weight-decay value (weight_decay on
// decayed tensors, 0 elsewhere); alignment padding joins the run before it (padding params
// and grads are zero and stay zero under any decay). AdamW and the CUDA model update by these.
struct DecayRun {
  int64_t offset = 0, count = 0;
  float weight_decay = 0;
};
std::vector<DecayRun> decay_runs(const ParamLayout& layout, double weight_decay);

// Note [SGD with momentum]
// optim.name = sgd runs torch.optim.SGD's rule (dampening 0, not Nesterov) in AdamW's state:
//   g' = g + wd p   (coupled L2, on the tensors AdamW decays: matrices, not norms or biases)
//   m  = mu m + g'  (m = g' at the first step, as m starts at zero)
//   p  = p - lr m
// v stays zero, so checkpoints keep their two sections and every layout, ZeRO stage, offload
// and parameter server steps it through the same class.
class AdamW {
 public:
  // Updates the parts of the flat buffer listed in `owned` (ZeRO: this rank's shard
  // pieces; empty: the whole buffer) and keeps moments for those parts only.
  // offloaded: the moments are not allocated; offload() must come before any use.
  AdamW(const ParamLayout& layout, const OptimConfig& cfg, std::vector<FlatRange> owned = {}, bool offloaded = false);
  ~AdamW();
  AdamW(AdamW&&) noexcept;
  // Note [Optimizer offload]: from now on the moments live in `file` (sized for
  // state_floats()); the in-memory ones are dropped. step() streams them; the 1-bit and 0/1
  // Adam methods need them in memory (refused by the config check).
  void offload(std::unique_ptr<StateFile> file);
  StateFile* offload_file() const { return file_.get(); }
  int64_t state_floats() const;
  // m (0) or v (1), packed in `owned` order, wherever it lives: in memory, or a mapping of
  // the offload file (checkpoint save and load; valid until the next step). bf16 moments
  // (Note [bf16 optimizer moments]) are widened into an fp32 copy, exactly; settle_moments()
  // then stores what was written into it (a load; round to nearest, exact for values that
  // came from bf16) and frees the copy.
  std::span<float> moment(int which);
  void settle_moments(bool written);
  // Where moment `which` is stored and its bytes (memory reports); {nullptr, 0} when offloaded.
  std::pair<const void*, int64_t> moment_storage(int which) const;
  // One update with learning rate `lr`; increments the step count (bias correction uses it).
  // With parameter offload, updated(begin, count, p) sees each sub-group's new parameters
  // (state [begin, begin + count)) before they are written back (Note [Chunk manager]).
  // before(begin, count) runs ahead of each sub-group's update (gradient chunks).
  // grad_scale: the update reads grad_scale * grads (the clipping coefficient; the same bits
  // as scaling the gradients first, without a pass of its own). AdamW only: SGD asserts 1.
  using UpdatedFn = std::function<void(int64_t begin, int64_t count, const float* p)>;
  using GroupFn = std::function<void(int64_t begin, int64_t count)>;
  void step(const Kernels& k, std::vector<float>& params, const std::vector<float>& grads, double lr,
            const UpdatedFn& updated = {}, const GroupFn& before = {}, float grad_scale = 1.0f);
  // The same update on the parts of `ranges` only (flat offsets; in memory, no offload), with
  // step count t for the bias correction; the count kept is left alone. Elementwise, so a
  // range updated alone gets the bits a whole step would give it (Note [PipeDream weight
  // stashing]: tied weights updated on their own schedule).
  void step_ranges(const Kernels& k, std::vector<float>& params, const std::vector<float>& grads, double lr,
                   int64_t t, const std::vector<FlatRange>& ranges, float grad_scale = 1.0f);
  // 1-bit Adam (Note [1-bit Adam] in parallel/compress.h), in two halves around the
  // caller's compressed all-reduce of the update u, with v and its bias correction
  // 1 - b2^frozen_at held where the warm-up left them: D = sqrt(v / (1 - b2^frozen_at)) + eps.
  // momentum_to_update: m = b1 m + (1 - b1) g, then grads <- u = m / D (0 where v == 0: no
  // gradient in the warm-up, nothing to scale by).
  void momentum_to_update(std::vector<float>& grads, int64_t frozen_at);
  // step_with_update: t += 1; m = u D (the reduced u back in momentum units);
  // p = p (1 - lr wd) - lr u / (1 - b1^t). With u = m / D this is AdamW's step.
  void step_with_update(std::vector<float>& params, const std::vector<float>& u, double lr, int64_t frozen_at);
  // 1-bit / top-k Adam under ZeRO (Note [Compressed Adam with ZeRO] in parallel/compress.h):
  // frozen_preconditioner() is D of the owned parts, packed in owned order (0 where v == 0);
  // step_with_mean_units(w), w (flat, owned parts read) the dp mean of the ranks' g / D: t += 1;
  // m = b1 m + (1 - b1) w D; p = p (1 - lr wd) - lr (m / D) / (1 - b1^t) where v > 0 (else
  // only the decay).
  std::vector<float> frozen_preconditioner(int64_t frozen_at) const;
  void step_with_mean_units(std::vector<float>& params, const std::vector<float>& w, double lr, int64_t frozen_at);
  // 0/1 Adam (Note [0/1 Adam] in parallel/compress.h): t += 1; m = b1 m + (1 - b1) g; v too
  // when update_v; p moves by AdamW's rule with bias corrections 1 - b1^t and 1 - b2^k, k =
  // v_updates (the variance updates so far, this one included). Returns lr / (1 - b1^t).
  double step_counted(std::vector<float>& params, const std::vector<float>& grads, double lr, bool update_v,
                    int64_t v_updates);
  // to: g <- g / D (0 where v is 0), else back, g <- g D: a gradient in update units for 0/1
  // Adam's compressed all-reduce, D = sqrt(v / (1 - b2^v_updates)) + eps.
  void update_units(std::vector<float>& g, int64_t v_updates, bool to) const;
  // After a synchronisation: m = -d D / lr_sum, d the mean parameter move over the steps
  // since the last one (laid out as the parameters), lr_sum those steps' step_counted
  // results (so the bias corrections are not folded into m), D = sqrt(v / (1 - b2^v_updates))
  // + eps. The weight decay in d leaves wd p D in m (as in DeepSpeed's 0/1 Adam).
  void momentum_from_move(const float* d, double lr_sum, int64_t v_updates);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  // fp32 moments of the owned parts, packed in `owned` order (the whole layout when
  // unsharded); empty with bf16 moments.
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<FlatRange>& owned() const { return owned_; }

 private:
  // Contiguous runs of the flat buffer sharing one weight-decay value; state_offset is
  // where the run's moments start in m_/v_.
  struct Run {
    int64_t offset, count;
    float weight_decay;
    int64_t state_offset = 0;
  };
  // One run's update, AdamW's or SGD's (Note [SGD with momentum]).
  void update_run(const Kernels& k, float* p, const float* g, float* m, float* v, int64_t n, double lr, float wd,
                  int64_t t, float grad_scale = 1.0f) const;
  // The same on bf16 moments at state offset s, the run's flat offset `at` (the rounding
  // bits' index, Note [bf16 optimizer moments]).
  void update_run_bf16(const Kernels& k, float* p, const float* g, int64_t s, int64_t at, int64_t n, double lr,
                       float wd, int64_t t, float grad_scale = 1.0f);
  std::vector<FlatRange> owned_;
  std::vector<Run> runs_;
  OptimConfig cfg_;
  std::vector<float> m_, v_;
  // optim.moments = bf16: the moments (m_, v_ stay empty), and their fp32 copies while a
  // checkpoint reads or writes them (moment()).
  std::vector<bf16> mh_, vh_;
  std::vector<float> wide_[2];
  std::unique_ptr<StateFile> file_;
  bool awaiting_file_ = false;  // built for offload, offload() not yet called
  int64_t t_ = 0;
  // t += 1; lr / (1 - b1^t) with b1 as the float the fast kernel receives.
  float next_step_size(double lr);
};

}  // namespace loom
