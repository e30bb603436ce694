#include "loom/optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "loom/core/adam.h"
#include "loom/core/error.h"
#include "loom/core/memory.h"
#include "loom/modes/offload/offload.h"

namespace loom {

double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const double min_lr = o.lr * o.min_lr_ratio;
  const int64_t decay_steps = total_steps - o.warmup_steps;
  if (decay_steps <= 0) return o.lr;
  const double progress = std::min(1.0, double(step - o.warmup_steps) / double(decay_steps));
  return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double clip_grad_norm(const Kernels& k, std::vector<float>& grads, double max_norm) {
  const double norm = std::sqrt(k.sum_squares(grads.data(), int64_t(grads.size())));
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) k.scale_inplace(grads.data(), int64_t(grads.size()), float(coef));
  }
  return norm;
}

void add_sum_squares(const Kernels& k, const float* x, const FlatRange& r, double& s) {
  for (int64_t at = r.offset, end = r.offset + r.count; at < end;) {
    const int64_t next = std::min(end, (at / kNormPiece + 1) * kNormPiece);
    s += k.sum_squares(x + at, next - at);
    at = next;
  }
}

double sum_squares(const Kernels& k, const float* x, const std::vector<FlatRange>& ranges) {
  double s = 0;
  for (const FlatRange& r : ranges) add_sum_squares(k, x, r, s);
  return s;
}

double clip_coef(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

std::vector<DecayRun> decay_runs(const ParamLayout& layout, double weight_decay) {
  std::vector<DecayRun> all;
  for (const ParamSpec& s : layout.specs()) {
    const float wd = s.decay ? float(weight_decay) : 0.0f;
    if (all.empty() || all.back().weight_decay != wd) all.push_back({s.offset, 0, wd});
  }
  for (size_t i = 0; i < all.size(); i++)
    all[i].count = (i + 1 < all.size() ? all[i + 1].offset : layout.total_floats()) - all[i].offset;
  return all;
}

AdamW::AdamW(const ParamLayout& layout, const OptimConfig& cfg, std::vector<FlatRange> owned, bool offloaded)
    : owned_(std::move(owned)), cfg_(cfg) {
  if (owned_.empty()) owned_.push_back({0, layout.total_floats()});
  const std::vector<DecayRun> all = decay_runs(layout, cfg.weight_decay);
  // Intersect with the owned ranges, packing the moments in owned order.
  int64_t state = 0;
  for (const FlatRange& o : owned_) {
    LOOM_CHECK(o.offset >= 0 && o.count >= 0 && o.offset + o.count <= layout.total_floats(), "optimizer shard [",
               o.offset, ", ", o.offset + o.count, ") is outside the parameter buffer of ", layout.total_floats());
    for (const DecayRun& r : all) {
      const int64_t lo = std::max(r.offset, o.offset), hi = std::min(r.offset + r.count, o.offset + o.count);
      if (hi > lo) runs_.push_back({lo, hi - lo, r.weight_decay, state + (lo - o.offset)});
    }
    state += o.count;
  }
  awaiting_file_ = offloaded;
  if (offloaded) return;  // offload() brings the file; the moments never touch memory
  if (cfg_.bf16_moments()) {  // Note [bf16 optimizer moments]; the config check refuses offload
    huge_resize(mh_, size_t(state));  // zeros, on huge pages (Note [Huge pages])
    huge_resize(vh_, size_t(state));
    return;
  }
  huge_resize(m_, size_t(state));
  huge_resize(v_, size_t(state));
}

AdamW::~AdamW() = default;
AdamW::AdamW(AdamW&&) noexcept = default;

int64_t AdamW::state_floats() const {
  int64_t n = 0;
  for (const FlatRange& o : owned_) n += o.count;
  return n;
}

void AdamW::offload(std::unique_ptr<StateFile> file) {
  LOOM_CHECK(file && file->state() == state_floats(), "the offload file holds ", file ? file->state() : -1,
             " floats of state, AdamW ", state_floats());
  // Before any step or restore the moments are zeros, as the freshly allocated file reads.
  LOOM_CHECK(t_ == 0, "optimizer offload starts before the first step; ", t_, " steps taken");
  // With the parameters in the file too, they are packed in `owned` order like the moments
  // (the whole flat buffer unsharded; Note [ZeRO-3 offload] in modes/offload/offload_part.cc otherwise).
  file_ = std::move(file);
  awaiting_file_ = false;
  std::vector<float>().swap(m_);
  std::vector<float>().swap(v_);
}

std::span<float> AdamW::moment(int which) {
  LOOM_ASSERT(!awaiting_file_, "AdamW built for offload is used before offload()");
  if (file_) return file_->map(which);
  if (cfg_.bf16_moments()) {
    const std::vector<bf16>& h = which == 0 ? mh_ : vh_;
    std::vector<float>& w = wide_[which];
    w.resize(h.size());
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < h.size(); i++) w[i] = from_bf16(h[i]);
    return std::span<float>(w);
  }
  return which == 0 ? std::span<float>(m_) : std::span<float>(v_);
}

void AdamW::settle_moments(bool written) {
  for (int which = 0; which < 2; which++) {
    std::vector<float>& w = wide_[which];
    if (w.empty()) continue;
    if (written) {
      std::vector<bf16>& h = which == 0 ? mh_ : vh_;
      LOOM_ASSERT(w.size() == h.size(), "the widened moment has ", w.size(), " values for ", h.size());
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < h.size(); i++) h[i] = to_bf16(w[i]);
    }
    std::vector<float>().swap(w);
  }
}

std::pair<const void*, int64_t> AdamW::moment_storage(int which) const {
  if (cfg_.bf16_moments()) {
    const std::vector<bf16>& h = which == 0 ? mh_ : vh_;
    return {h.data(), int64_t(h.size() * sizeof(bf16))};
  }
  const std::vector<float>& f = which == 0 ? m_ : v_;
  return {f.data(), int64_t(f.size() * sizeof(float))};
}

void AdamW::update_run(const Kernels& k, float* p, const float* g, float* m, float* v, int64_t n, double lr, float wd,
                       int64_t t, float grad_scale) const {
  if (!cfg_.sgd()) {
    k.adamw_update(p, g, m, v, n, float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps), wd, t, grad_scale);
    return;
  }
  // Note [SGD with momentum]. The caller scales SGD's gradients itself: here g s + wd p could
  // contract into one fused multiply-add and round differently from scaling first.
  LOOM_ASSERT(grad_scale == 1.0f, "SGD takes pre-scaled gradients");
  const float mu = float(cfg_.momentum), step = float(lr);
  for (int64_t i = 0; i < n; ++i) {
    m[i] = mu * m[i] + (g[i] + wd * p[i]);
    p[i] -= step * m[i];
  }
}

void AdamW::update_run_bf16(const Kernels& k, float* p, const float* g, int64_t s, int64_t at, int64_t n, double lr,
                            float wd, int64_t t, float grad_scale) {
  LOOM_CHECK(k.adamw_update_bf16_moments, "optim.moments = bf16: the ", k.backend, " kernels have no bf16-moment AdamW");
  k.adamw_update_bf16_moments(p, g, mh_.data() + s, vh_.data() + s, n, float(lr), float(cfg_.beta1), float(cfg_.beta2),
                              float(cfg_.eps), wd, t, grad_scale, at);
}

void AdamW::step(const Kernels& k, std::vector<float>& params, const std::vector<float>& grads, double lr,
                 const UpdatedFn& updated, const GroupFn& before, float grad_scale) {
  LOOM_ASSERT(!awaiting_file_, "AdamW built for offload steps before offload()");
  t_++;
  if (cfg_.bf16_moments()) {
    for (const Run& r : runs_)
      update_run_bf16(k, params.data() + r.offset, grads.data() + r.offset, r.state_offset, r.offset, r.count, lr,
                      r.weight_decay, t_, grad_scale);
    return;
  }
  // State [lo, hi) of run r; p: its parameters when they are offloaded too, else in `params`.
  auto update = [&](const Run& r, int64_t lo, int64_t hi, float* m, float* v, float* p) {
    const int64_t at = r.offset + (lo - r.state_offset);
    update_run(k, p ? p : params.data() + at, grads.data() + at, m, v, hi - lo, lr, r.weight_decay, t_, grad_scale);
  };
  if (!file_) {
    for (const Run& r : runs_)
      update(r, r.state_offset, r.state_offset + r.count, m_.data() + r.state_offset, v_.data() + r.state_offset,
             nullptr);
    return;
  }
  // Note [Optimizer offload]: the runs cut by sub-group; elementwise, so the same bits.
  file_->for_each([&](int64_t begin, int64_t count, float* m, float* v, float* p) {
    if (before) before(begin, count);
    for (const Run& r : runs_) {
      const int64_t lo = std::max(begin, r.state_offset), hi = std::min(begin + count, r.state_offset + r.count);
      if (hi > lo) update(r, lo, hi, m + (lo - begin), v + (lo - begin), p ? p + (lo - begin) : nullptr);
    }
    if (p && updated) updated(begin, count, p);
  });
}

void AdamW::step_ranges(const Kernels& k, std::vector<float>& params, const std::vector<float>& grads, double lr,
                        int64_t t, const std::vector<FlatRange>& ranges, float grad_scale) {
  LOOM_ASSERT(!file_ && !awaiting_file_, "AdamW::step_ranges runs on in-memory moments");
  for (const Run& r : runs_)
    for (const FlatRange& q : ranges) {
      const int64_t lo = std::max(r.offset, q.offset), hi = std::min(r.offset + r.count, q.offset + q.count);
      if (hi <= lo) continue;
      const int64_t s = r.state_offset + (lo - r.offset);
      if (cfg_.bf16_moments())
        update_run_bf16(k, params.data() + lo, grads.data() + lo, s, lo, hi - lo, lr, r.weight_decay, t, grad_scale);
      else
        update_run(k, params.data() + lo, grads.data() + lo, m_.data() + s, v_.data() + s, hi - lo, lr, r.weight_decay, t,
                   grad_scale);
    }
}

namespace {

// sqrt(v / (1 - b2^frozen_at)) + eps, in the fast kernel's float order (betas as the floats it
// receives).
struct FrozenScale {
  float inv_bc2_sqrt, eps;
  float operator()(float v) const { return std::sqrt(v) * inv_bc2_sqrt + eps; }
};

FrozenScale frozen_scale(const OptimConfig& c, int64_t frozen_at) {
  LOOM_CHECK(frozen_at >= 1, "a frozen Adam variance needs at least one update before it; got ", frozen_at);
  return {adam_inv_bias_correction2(float(c.beta2), frozen_at), float(c.eps)};
}

}  // namespace

float AdamW::next_step_size(double lr) {
  t_++;
  return float(lr) / float(1.0 - std::pow(double(float(cfg_.beta1)), double(t_)));
}

void AdamW::momentum_to_update(std::vector<float>& grads, int64_t frozen_at) {
  LOOM_ASSERT(!cfg_.bf16_moments(), "the config check refuses bf16 moments with 1-bit / 0/1 Adam");
  const FrozenScale d = frozen_scale(cfg_, frozen_at);
  const float b1 = float(cfg_.beta1);
  for (const Run& r : runs_) {
    float* g = grads.data() + r.offset;
    float* m = m_.data() + r.state_offset;
    const float* v = v_.data() + r.state_offset;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < r.count; i++) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      g[i] = v[i] > 0.0f ? m[i] / d(v[i]) : 0.0f;
    }
  }
}

double AdamW::step_counted(std::vector<float>& params, const std::vector<float>& grads, double lr, bool update_v,
                           int64_t v_updates) {
  LOOM_ASSERT(!cfg_.bf16_moments(), "the config check refuses bf16 moments with 0/1 Adam");
  const FrozenScale d = frozen_scale(cfg_, v_updates);
  const float step_size = next_step_size(lr);
  const float b1 = float(cfg_.beta1), b2 = update_v ? float(cfg_.beta2) : 1.0f;
  for (const Run& r : runs_) {
    float* p = params.data() + r.offset;
    const float* g = grads.data() + r.offset;
    float* m = m_.data() + r.state_offset;
    float* v = v_.data() + r.state_offset;
    const float decay = 1.0f - float(lr) * r.weight_decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < r.count; i++) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      if (update_v) v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] = p[i] * decay - (v[i] > 0.0f ? step_size * m[i] / d(v[i]) : 0.0f);
    }
  }
  return step_size;
}

void AdamW::update_units(std::vector<float>& g, int64_t v_updates, bool to) const {
  LOOM_ASSERT(!cfg_.bf16_moments(), "the config check refuses bf16 moments with 1-bit / 0/1 Adam");
  const FrozenScale D = frozen_scale(cfg_, v_updates);
  for (const Run& r : runs_) {
    float* x = g.data() + r.offset;
    const float* v = v_.data() + r.state_offset;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < r.count; i++) x[i] = to ? (v[i] > 0.0f ? x[i] / D(v[i]) : 0.0f) : x[i] * D(v[i]);
  }
}

void AdamW::momentum_from_move(const float* d, double lr_sum, int64_t v_updates) {
  LOOM_ASSERT(!cfg_.bf16_moments(), "the config check refuses bf16 moments with 1-bit / 0/1 Adam");
  const FrozenScale D = frozen_scale(cfg_, v_updates);
  const float inv = float(-1.0 / lr_sum);
  for (const Run& r : runs_) {
    const float* x = d + r.offset;
    float* m = m_.data() + r.state_offset;
    const float* v = v_.data() + r.state_offset;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < r.count; i++) m[i] = x[i] * D(v[i]) * inv;
  }
}

void AdamW::step_with_update(std::vector<float>& params, const std::vector<float>& u, double lr, int64_t frozen_at) {
  LOOM_ASSERT(!cfg_.bf16_moments(), "the config check refuses bf16 moments with 1-bit / 0/1 Adam");
  const FrozenScale d = frozen_scale(cfg_, frozen_at);
  const float step_size = next_step_size(lr);
  for (const Run& r : runs_) {
    float* p = params.data() + r.offset;
    const float* x = u.data() + r.offset;
    float* m = m_.data() + r.state_offset;
    const float* v = v_.data() + r.state_offset;
    const float decay = 1.0f - float(lr) * r.weight_decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < r.count; i++) {
      m[i] = x[i] * d(v[i]);
      p[i] = p[i] * decay - step_size * x[i];
    }
  }
}

std::vector<float> AdamW::frozen_preconditioner(int64_t frozen_at) const {
  LOOM_ASSERT(!cfg_.bf16_moments(), "the config check refuses bf16 moments with 1-bit / top-k Adam");
  const FrozenScale d = frozen_scale(cfg_, frozen_at);
  std::vector<float> D(v_.size());
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < v_.size(); i++) D[i] = v_[i] > 0.0f ? d(v_[i]) : 0.0f;
  return D;
}

void AdamW::step_with_mean_units(std::vector<float>& params, const std::vector<float>& w, double lr,
                                 int64_t frozen_at) {
  LOOM_ASSERT(!cfg_.bf16_moments(), "the config check refuses bf16 moments with 1-bit / top-k Adam");
  const FrozenScale d = frozen_scale(cfg_, frozen_at);
  const float step_size = next_step_size(lr);
  const float b1 = float(cfg_.beta1);
  for (const Run& r : runs_) {
    float* p = params.data() + r.offset;
    const float* x = w.data() + r.offset;
    float* m = m_.data() + r.state_offset;
    const float* v = v_.data() + r.state_offset;
    const float decay = 1.0f - float(lr) * r.weight_decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < r.count; i++) {
      const float D = v[i] > 0.0f ? d(v[i]) : 0.0f;
      m[i] = b1 * m[i] + (1.0f - b1) * x[i] * D;
      p[i] = p[i] * decay - (D > 0.0f ? step_size * (m[i] / D) : 0.0f);
    }
  }
}

}  // namespace loom
