#include "loom/modes/stream/async_pipe.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/train/trace.h"

namespace loom {

AsyncPipeState::AsyncPipeState(const Config& cfg, ScheduleKind kind, Model& model, MemoryTracker& memory, int pp_rank,
                               int pp, bool pipeline, bool tied_head)
    : kind_(kind), model_(model), pp_(pp), tau_(pp - 1 - pp_rank), pipeline_(pipeline),
      tied_head_(tied_head) {
  LOOM_ASSERT(updates_per_batch(kind) && pp_rank >= 0 && pp_rank < pp);
  if (kind == ScheduleKind::kPipeMare) {
    decay_ = cfg.parallel.pipemare_decay;
    anneal_ = cfg.parallel.pipemare_anneal(cfg.optim.warmup_steps);
    warmup_ = cfg.parallel.sync_warmup_steps;
  }
  const size_t n = model.params().size();
  const int params = memory.category("params");
  auto hold = [&](std::vector<float>& v, size_t size) {
    huge_resize(v, size, 0.0f);  // zeros, on huge pages (Note [Huge pages]): walked whole each update
    memory.track(params, v.data(), int64_t(size * sizeof(float)));
  };
  if (kind == ScheduleKind::kPipeDream && pipeline && tau_ > 0) {
    stash_.resize(size_t(tau_));
    for (std::vector<float>& s : stash_) hold(s, n);
    stash_busy_.assign(size_t(tau_), 0);
  }
  if (kind == ScheduleKind::kPipeMare && tau_ > 0) {
    hold(delta_, n);
    hold(u_, n);
  }
  if (tied_head) {
    wte_ = {model.layout().at("wte").offset, model.layout().at("wte").numel};
    for (int u = 0; u < model.units(); u++) {
      const FlatRange r = model.unit_range(u);
      if (r.count > 0 && wte_.offset >= r.offset && wte_.offset < r.offset + r.count) head_unit_ = u;
    }
    LOOM_ASSERT(head_unit_ >= 0, "no unit holds the tied wte copy");
    if (!pipeline) hold(head_buf_, size_t(model.unit_range(head_unit_).count));
  }
}

void AsyncPipeState::bind(float* base) { model_.bind_params(base); }

int AsyncPipeState::depth(int64_t batch, int tau) const {
  return int(std::min<int64_t>(batch - stream_start_, tau));
}

double AsyncPipeState::lr_scale(int64_t batch, int tau) const {
  const int d = depth(batch, tau);  // this update's delay: 0 through a synchronous warm-up
  if (kind_ != ScheduleKind::kPipeMare || d <= 0) return 1.0;
  const double p = std::max(0.0, 1.0 - double(batch - warmup_) / double(anneal_));
  return std::pow(double(d), -p);
}

int64_t AsyncPipeState::tied_needed(int64_t batch) const { return batch - depth(batch, tied_delay()); }

std::optional<parallel::PipelineRunner::Stream> AsyncPipeState::executor(int64_t step, bool flush) {
  if (!started_) {
    started_ = true;
    stream_start_ = step;
    std::fill(delta_.begin(), delta_.end(), 0.0f);
  }
  step_ = step;
  parallel::PipelineRunner::Stream o;
  o.age = int(std::min<int64_t>(step - stream_start_, pp_));
  o.flush = flush;
  o.weights = [this](int back, bool forward) {
    if (back < 0) return bind(nullptr);  // the step is over
    if (forward) bind_forward(step_ - back);
    else bind_backward(step_ - back);
  };
  if (pipeline_)
    o.after_backward = [this](int back) {
      if (trace_update) trace_update(-back, true);
      update(step_ - back);
      if (trace_update) trace_update(-back, false);
    };
  return o;
}

void AsyncPipeState::trace(Trace* t) {
  if (!pipeline_) return;  // Note [PipeDream weight stashing]: updates inside the stream
  if (!t) {
    trace_update = nullptr;
    return;
  }
  trace_update = [t](int micro, bool begin) {
    if (begin) t->begin("U" + std::to_string(micro), "pipeline");
    else t->end();
  };
}

// The reference's tied head: its head unit on a buffer holding the current weights but wte
// at the first stage's version for `batch`.
void AsyncPipeState::bind_head(float* head_base) {
  const FlatRange unit = model_.unit_range(head_unit_);
  std::copy(model_.params().begin() + unit.offset, model_.params().begin() + unit.offset + unit.count,
            head_buf_.begin());
  if (head_base != nullptr)
    std::copy(head_base, head_base + wte_.count, head_buf_.begin() + (wte_.offset - unit.offset));
  model_.bind_unit_params(head_unit_, head_buf_.data());
}

void AsyncPipeState::reference_bind(int64_t batch, float* base) {
  bind(base);
  if (tied_head_) {
    const int d0 = depth(batch, tied_delay());
    bind_head(d0 > 0 ? wte_history_[size_t(d0 - 1)].data() : nullptr);
  }
}

float* AsyncPipeState::version(int d) { return d > 0 ? history_[size_t(d - 1)].data() : nullptr; }

void AsyncPipeState::bind_forward(int64_t batch) {
  if (!pipeline_) {
    const int d = depth(batch, tau_);
    reference_bind(batch, version(d));
    if (on_version) on_version(pp_ - 1 - tau_, batch, true, updates_ - d);
    return;
  }
  if (tied_head_) catch_up_tied(batch);  // wte at the first stage's version for this batch
  bind(nullptr);
  flight_.push_back({batch, updates_, -1});
  if (on_version) on_version(pp_ - 1 - tau_, batch, true, updates_);
}

float* AsyncPipeState::corrected(int d) {
  const std::vector<float>& w = model_.params();
  const float k = float(d);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < w.size(); i++) u_[i] = w[i] - k * delta_[i];
  return u_.data();
}

void AsyncPipeState::bind_backward(int64_t batch) {
  const bool mare = kind_ == ScheduleKind::kPipeMare;
  if (!pipeline_) {
    const int d = depth(batch, tau_);
    reference_bind(batch, !mare ? version(d) : d > 0 && decay_ > 0 ? corrected(d) : nullptr);
    if (on_version) on_version(pp_ - 1 - tau_, batch, false, mare ? updates_ : updates_ - d);
    return;
  }
  LOOM_ASSERT(!flight_.empty() && flight_.front().batch == batch, "stage ", pp_ - 1 - tau_, " runs the backward of ",
              "minibatch ", batch, " out of order");
  const InFlight& f = flight_.front();
  if (mare) {
    const int d = int(updates_ - f.version);
    bind(d > 0 && decay_ > 0 ? corrected(d) : nullptr);
  } else {
    bind(f.stash >= 0 ? stash_[size_t(f.stash)].data() : nullptr);
  }
  if (on_version) on_version(pp_ - 1 - tau_, batch, false, mare ? updates_ : f.version);
}

void AsyncPipeState::before_update(int64_t batch) {
  const std::vector<float>& w = model_.params();
  if (pipeline_) {
    LOOM_ASSERT(!flight_.empty() && flight_.front().batch == batch);
    const int freed = flight_.front().stash;
    flight_.pop_front();
    if (freed >= 0) --stash_busy_[size_t(freed)];
    // Pipedream: every forward since the last update computed on the current weights; they
    // share one stashed copy from here on.
    int holders = 0;
    for (const InFlight& f : flight_) holders += f.stash < 0;
    if (!stash_.empty() && holders > 0) {
      const int slot = int(std::find(stash_busy_.begin(), stash_busy_.end(), 0) - stash_busy_.begin());
      LOOM_ASSERT(slot < int(stash_.size()), "stage ", pp_ - 1 - tau_, " needs more than ", tau_, " stashed versions");
      std::copy(w.begin(), w.end(), stash_[size_t(slot)].begin());
      stash_busy_[size_t(slot)] = holders;
      for (InFlight& f : flight_)
        if (f.stash < 0) f.stash = slot;
    }
  } else {
    if (tau_ > 0) {
      history_.emplace_front(w);
      if (int(history_.size()) > tau_) history_.pop_back();
    }
    if (tied_head_) {
      wte_history_.emplace_front(w.begin() + wte_.offset, w.begin() + wte_.offset + wte_.count);
      if (int(wte_history_.size()) > tied_delay()) wte_history_.pop_back();
    }
  }
  if (!delta_.empty() && decay_ > 0) std::copy(w.begin(), w.end(), u_.begin());  // W_old, for delta
}

void AsyncPipeState::after_update() {
  ++updates_;
  if (delta_.empty() || decay_ <= 0) return;
  const float gamma = float(std::pow(decay_, 1.0 / double(tau_)));
  const std::vector<float>& w = model_.params();
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < w.size(); i++) delta_[i] = gamma * delta_[i] + (1.0f - gamma) * (w[i] - u_[i]);
}

void AsyncPipeState::end_step(bool flush) {
  if (flush) {
    LOOM_ASSERT(flight_.empty(), "stage ", pp_ - 1 - tau_, " flushed with ", flight_.size(), " minibatches in flight");
    started_ = false;
  }
}

}  // namespace loom
