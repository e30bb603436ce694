// The Updater's side of pipedream and pipemare (Note [PipeDream weight stashing], Note
// [PipeMare] in modes/stream/async_pipe.h): an update per minibatch on each stage, the tied wte's
// two copies, the step's end, and the reference's update.
#include <cmath>

#include "loom/core/error.h"
#include "loom/engine/engine.h"
#include "loom/modes/stream/async_pipe.h"

namespace loom {

namespace {

// Elementwise a += b over n floats.
void add_into(float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) a[i] += b[i];
}

int peer(const comm::Group& g) { return 1 - g.group_rank(); }

// Tags of the tied wte messages: the minibatch, wrapped (each link delivers in order; the tag
// catches a mix-up).
int tied_tag(int64_t batch) { return int(batch % 16381); }  // tags are < 16384

}  // namespace

void Updater::attach_async() {
  AsyncPipeState& s = *async_;
  const ParamSpec* wte = e_.model.layout().find("wte");
  if (wte && e_.rc.holds_tied_copy(cfg_.model))
    untied_ = subtract({FlatRange{0, int64_t(e_.model.params().size())}}, {wte->offset, wte->numel});
  if (!s.pipeline()) return;
  // The tied wte gradients in flight between the first and last stage: the first stage takes
  // the head's pp - 1 steps after it was sent, so the last stage keeps up to pp of them.
  if (e_.rc.embed && wte) {
    tied_sends_.resize(size_t(e_.rc.pp_size));
    for (TiedSend& t : tied_sends_) {
      huge_resize(t.buf, size_t(wte->numel), 0.0f);
      e_.memory.track(e_.memory.category("buffers"), t.buf.data(), wte->numel * int64_t(sizeof(float)));
    }
  }
  s.update = [this](int64_t batch) { update_batch(batch); };
  s.catch_up_tied = [this](int64_t batch) { catch_up_tied(async_->tied_needed(batch)); };
}

// A pipeline stage's update of minibatch `batch`, right after its backward here. The first
// stage of a tied GPT pipeline adds the head's wte gradient (sent after the last stage's
// backward of the same minibatch, long done) and sends the sum on; the last stage sends its
// head's part and updates all but wte, whose update it applies later (catch_up_tied).
void Updater::update_batch(int64_t batch) {
  const RankContext& rc = e_.rc;
  AsyncPipeState& s = *async_;
  Model& model = e_.model;
  const Kernels& k = model.ops();
  std::vector<float>& g = model.grads();
  LOOM_ASSERT(adamw_.steps_taken() == batch, "stage ", rc.pp_rank, " updates minibatch ", batch, " after ",
              adamw_.steps_taken(), " updates");
  bool reduced = false;
  if (!tied_sends_.empty()) {
    const ParamSpec& wte = model.layout().at("wte");
    float* const gw = g.data() + wte.offset;
    TiedSend& t = tied_sends_[size_t(batch % int64_t(tied_sends_.size()))];
    t.work.wait();  // its earlier message was taken
    comm::Group* link = rc.embed.get();
    if (untied_.empty()) {  // the first stage: its sum with the head's part, sent on to the last
      rc.embed->recv(std::span<float>(t.buf), peer(*rc.embed), tied_tag(batch));
      add_into(gw, t.buf.data(), wte.numel);
      link = rc.tied_down.get();
      dp_mean(g);  // the replicas' mean of the summed copy is what both ends apply
      reduced = true;
    }
    std::copy(gw, gw + wte.numel, t.buf.begin());  // the last stage: the head's part, to the first
    t.work = link->send(std::span<const float>(t.buf), peer(*link), tied_tag(batch), {.async = true});
  }
  if (!reduced) dp_mean(g);  // Note [Streams with data parallelism]
  applied_sq_ += sum_squares(k, g.data(), norm_ranges_);
  const double lr = lr_at(cfg_.optim, batch, cfg_.train.steps) * s.lr_scale(batch, s.delay());
  s.before_update(batch);
  if (untied_.empty()) {
    adamw_.step(k, model.params(), g, lr);
  } else {
    adamw_.step_ranges(k, model.params(), g, lr, batch + 1, untied_);
    adamw_.set_steps_taken(batch + 1);
  }
  s.after_update();
  model.zero_grads();
}

// The last stage of a tied GPT pipeline: the first stage's wte updates of the minibatches
// before `until`, each with the sum it sent, that minibatch's step count and learning rate
// (at the first stage's delay), so its copy holds the version the next forward needs.
void Updater::catch_up_tied(int64_t until) {
  const RankContext& rc = e_.rc;
  AsyncPipeState& s = *async_;
  if (untied_.empty()) return;
  next_tied_ = std::max(next_tied_, s.stream_start());
  Model& model = e_.model;
  const ParamSpec& wte = model.layout().at("wte");
  std::vector<float>& g = model.grads();
  const std::span<float> into(g.data() + wte.offset, size_t(wte.numel));
  for (; next_tied_ < until; ++next_tied_) {
    rc.tied_down->recv(into, peer(*rc.tied_down), tied_tag(next_tied_));
    const double lr = lr_at(cfg_.optim, next_tied_, cfg_.train.steps) * s.lr_scale(next_tied_, s.tied_delay());
    adamw_.step_ranges(model.ops(), model.params(), g, lr, next_tied_ + 1, {FlatRange{wte.offset, wte.numel}});
    std::fill(into.begin(), into.end(), 0.0f);
  }
}

// The step's end on a pipeline stage: its updates ran during the step. The loss (and the
// norm of the gradients applied in the step, every stage's own minibatch) is summed over
// the ranks without a barrier (Note [2BW without a barrier]); a flush sums at once, lets a
// tied last stage apply the wte updates it still owes, and ends the stream.
Updater::Result Updater::step_async(double local_loss, double, int64_t step, bool flush) {
  Result r;
  sum_loss(r, local_loss, std::exchange(applied_sq_, 0.0), flush);
  if (flush) {
    catch_up_tied(step + 1);
    for (TiedSend& t : tied_sends_) t.work.wait();
  }
  async_->end_step(flush);
  return r;
}

// The reference's update (a flushing pipeline, one minibatch per step): the tied copies'
// gradients are already summed; every stage updates at once with its own learning-rate
// factor (a tied head's wte at the first stage's), recording the versions its later
// minibatches compute on.
Updater::Result Updater::step_async_reference(double local_loss, double lr, int64_t step, bool flush) {
  const RankContext& rc = e_.rc;
  AsyncPipeState& s = *async_;
  Model& model = e_.model;
  const Kernels& k = model.ops();
  LOOM_ASSERT(cfg_.optim.grad_clip == 0 && !scaler_.enabled());
  Result r;
  double v[2] = {local_loss, sum_squares(k, model.grads().data(), norm_ranges_)};
  rc.stats_sum(v);
  r.loss = v[0] / (rc.dp_size * rc.tp_size);
  r.norm = std::sqrt(v[1] / rc.dp_size);  // every dp replica counted the same gradient
  s.before_update(step);
  const double own = lr * s.lr_scale(step, s.delay());
  if (untied_.empty()) {
    adamw_.step(k, model.params(), model.grads(), own);
  } else {
    const ParamSpec& wte = model.layout().at("wte");
    adamw_.step_ranges(k, model.params(), model.grads(), own, step + 1, untied_);
    adamw_.step_ranges(k, model.params(), model.grads(), lr * s.lr_scale(step, s.tied_delay()), step + 1,
                       {FlatRange{wte.offset, wte.numel}});
    adamw_.set_steps_taken(step + 1);
  }
  s.after_update();
  s.end_step(flush);
  return r;
}

}  // namespace loom
