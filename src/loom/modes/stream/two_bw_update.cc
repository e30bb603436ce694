// The Updater's side of 2bw (Note [PipeDream-2BW] in parallel/schedule.h) and what every
// stream shares: the sums started without a barrier (Note [2BW without a barrier]) and the
// stage replicas' mean (Note [Streams with data parallelism]).
#include <cmath>
#include <utility>

#include "loom/core/error.h"
#include "loom/engine/engine.h"
#include "loom/modes/stream/two_bw.h"
#include "loom/parallel/grad_sync.h"

namespace loom {

// Note [PipeDream-2BW]: the gradients complete at this step's end (none, the previous step's,
// and on a flush also this step's), each clipped by its own global norm and applied with its
// own step's learning rate, in order. Nothing is skipped (2bw refuses fp16 loss scaling).
//
// Note [2BW without a barrier]
// Summing the loss and the norms over every rank at the step's end would make the end a
// barrier, after which the forwards ramp up again ((p - 1) F of idle on the last stage, a
// third of 1F1B's bubble at B = 2 F). So a 2bw pipeline starts the pending gradient's sums
// the moment it is complete - the tied wte's all-reduce between the first and last stage,
// then the norm's - on their groups' workers, and takes them at the step's end, by when every
// rank has long started them; and it reports a step's loss one step late (its sum started at
// the step's end, taken at the next). A flush sums synchronously. Same sums, same order on
// every rank: the numbers do not change.
Updater::Result Updater::step_two_bw(double local_loss, double, int64_t step, bool flush) {
  const RankContext& rc = e_.rc;
  const Kernels& k = e_.model.ops();
  TwoBwState& s = *two_bw_;
  const std::vector<TwoBwState::Update> updates = s.updates(step, flush);
  {
    const Spans::Scope busy = s.update_scope(flush);  // Note [Measured bubble]
    s.before_updates(flush);
  }
  start_deferred_norm();
  Result r;
  sum_loss(r, local_loss, 0, flush);
  for (const TwoBwState::Update& u : updates) {
    std::vector<float>& g = *u.grads;
    const bool pending = &g != &e_.model.grads();
    if (pending && s.updates_into_stash(flush)) {  // Note [2BW's update in the waits]
      r.norm = finish_in_stash();
      continue;
    }
    // Note [Vocabulary passes across a step's end]: the leading vocab_floats() were updated in a
    // pass, with this norm; the rest now, with the same step count.
    if (pending && vocab_applied_) {
      r.norm = pending_norm_;
      const Spans::Scope busy = s.update_scope(flush);
      update_ranges(e_.model.params(), g, r.norm, lr_at(cfg_.optim, u.batch, cfg_.train.steps),
                    subtract(adamw_.owned(), {0, s.vocab_floats()}), true);
      continue;
    }
    double ss = 0;
    if (norm_started_ && pending) {
      ss = take_pending_norm();
    } else {
      if (s.pipeline()) dp_mean(g);  // a flush's own gradient (the reference's sync reduced it)
      double v[2] = {0, sum_squares(k, g.data(), norm_ranges_)};
      rc.stats_sum(v);
      ss = v[1];
    }
    r.norm = std::sqrt(ss / rc.dp_size);  // every dp replica counted the same gradient
    const Spans::Scope busy = s.update_scope(flush);
    const float coef = clip_scale(g, r.norm, adamw_.owned());
    adamw_.step(k, e_.model.params(), g, lr_at(cfg_.optim, u.batch, cfg_.train.steps), {}, {}, coef);
  }
  pending_norm_ = -1, vocab_applied_ = false;
  s.after_updates(flush);
  return r;
}

// Note [2BW's update in the waits]
// A stage with a stash writes W(t) = AdamW(W(t-1), pending) into the stash (Note [Early
// stash] in two_bw.h) once the pending gradient and its global norm are in: a piece before
// each of its backwards' receives, where it waits anyway while a later stage is slower (a
// stage with the head; the first stage of config A at pp 2). The rest at the step's end,
// then the buffers are exchanged. There the whole update (a copy and AdamW, about 0.5 ms on
// A's first stage) had stood between the step's end and the next forwards, which the last
// stage waited for. A piece is the floats left over the backwards left, a whole number of
// 64-float blocks; AdamW being elementwise (Note [Vectorized AdamW]), every float gets the
// bits the whole update gives it.
void Updater::update_in_wait(int left) {
  StashUpdate& u = stash_update_;
  if (!u.ready && !prepare_stash_update(false)) return;
  const int64_t end = int64_t(e_.model.params().size());
  if (u.next >= end) return;
  const int64_t piece = ((end - u.next + left - 1) / left + 63) / 64 * 64;
  const Spans::Scope busy = two_bw_->update_scope(false, "U wait");  // Note [Measured bubble]
  write_stash(std::min(end, u.next + piece));
}

// The norm (wait: until its sum is in; else false while it runs), the clipping coefficient,
// the learning rate of the pending gradient's batch and the step count it is applied with.
bool Updater::prepare_stash_update(bool wait) {
  const double norm = pending_norm(wait);
  if (norm < 0) return false;
  StashUpdate& u = stash_update_;
  const int64_t vocab = two_bw_->vocab_floats();  // applied in a pass (update_vocab)
  u.ranges = subtract(adamw_.owned(), {0, vocab});
  u.coef = clip_scale(two_bw_->pending(), norm, u.ranges);
  u.lr = lr_at(cfg_.optim, two_bw_->pending_batch(), cfg_.train.steps);
  u.t = adamw_.steps_taken() + 1;
  u.next = vocab;
  u.ready = true;
  return true;
}

// Floats [next, to) of the stash: W(t-1) copied from the parameters, then updated in place.
void Updater::write_stash(int64_t to) {
  StashUpdate& u = stash_update_;
  const std::vector<float>& p = e_.model.params();
  std::vector<float>& stash = two_bw_->stash();
  std::copy(p.begin() + u.next, p.begin() + to, stash.begin() + u.next);
  adamw_.step_ranges(e_.model.ops(), stash, two_bw_->pending(), u.lr, u.t, intersect(u.ranges, {u.next, to - u.next}),
                     u.coef);
  u.next = to;
}

// The step's end, or before the next step's first forward when this step runs it (Note [The
// next step's first forwards ahead] in parallel/schedule.h): the rest of the stash, the step
// counted, the buffers exchanged, once.
double Updater::finish_in_stash() {
  if (two_bw_->stash_taken()) return pending_norm_;
  if (!stash_update_.ready) prepare_stash_update(true);
  {
    const Spans::Scope busy = two_bw_->update_scope(false);
    write_stash(int64_t(e_.model.params().size()));
    adamw_.set_steps_taken(stash_update_.t);
    two_bw_->take_stash_as_params();
  }
  stash_update_ = {};
  return pending_norm_;
}

// Note [Vocabulary passes across a step's end]: the vocabulary run's update mid-step, the rest
// at the step's end; AdamW being elementwise, each float gets the bits one update would give.
void Updater::update_vocab(std::vector<float>& pending, int64_t step, std::vector<float>* aside) {
  LOOM_ASSERT(!vocab_applied_ && (norm_started_ || pending_norm_ >= 0),
              "the vocabulary tensors' update before the pending norm's sum");
  const double norm = pending_norm(true);
  vocab_applied_ = true;
  const int64_t n = int64_t(pending.size()), vocab = two_bw_->vocab_floats();
  const Spans::Scope busy = two_bw_->update_scope(false);  // Note [Measured bubble]: after the wait
  std::vector<float>& params = aside ? *aside : e_.model.params();
  if (aside) std::copy(e_.model.params().begin(), e_.model.params().begin() + vocab, aside->begin());
  update_ranges(params, pending, norm, lr_at(cfg_.optim, step - 1, cfg_.train.steps),
                subtract(adamw_.owned(), {vocab, n - vocab}), false);
}

double Updater::pending_norm(bool wait) {
  if (pending_norm_ >= 0) return pending_norm_;
  if (!wait) {
    poll_deferred_norm();
    if (!norm_started_ || deferred_norm_ || !wte_work_.done() || !norm_work_.done()) return -1;
  }
  return pending_norm_ = std::sqrt(take_pending_norm() / e_.rc.dp_size);  // every dp replica counted the same gradient
}

void Updater::update_ranges(std::vector<float>& params, std::vector<float>& g, double norm, double lr,
                            const std::vector<FlatRange>& ranges, bool counts_step) {
  const float coef = clip_scale(g, norm, ranges);
  const int64_t t = adamw_.steps_taken() + 1;
  adamw_.step_ranges(e_.model.ops(), params, g, lr, t, ranges, coef);
  if (counts_step) adamw_.set_steps_taken(t);
}

// The clipping coefficient of `norm` for the update to read (AdamW's grad_scale: the bits of
// scaling first, without a pass over the gradient); SGD takes g scaled in `ranges`, and 1.
float Updater::clip_scale(std::vector<float>& g, double norm, const std::vector<FlatRange>& ranges) const {
  const double coef = clip_coef(norm, cfg_.optim.grad_clip);
  if (coef == 1.0 || !cfg_.optim.sgd()) return float(coef);
  for (const FlatRange& o : ranges) e_.model.ops().scale_inplace(g.data() + o.offset, o.count, float(coef));
  return 1.0f;
}

void Updater::start_pending_norm(std::vector<float>& g) {
  const RankContext& rc = e_.rc;
  norm_started_ = true;
  if (rc.embed) {  // GPT pipeline: the two tied wte copies' gradients summed
    const ParamSpec& w = e_.model.layout().at("wte");
    wte_work_ = rc.embed->all_reduce(std::span<float>(g.data() + w.offset, size_t(w.numel)), comm::ReduceOp::kSum,
                                     {.async = true, .lazy = true});
    // The head's copy is left out of the norm (norm_ranges_), the embedding's counted: its
    // squares wait for the sum. Without replicas the first stage takes them once the sum is
    // through (poll_deferred_norm, after each of its backwards) or at the step's end
    // (start_deferred_norm), not here: waiting here idled it until the last stage's worker got
    // a core between two backwards (2.4 ms of config A's 44 ms pp 2 step, two ranks on two
    // cores). With replicas the sum comes before their mean of the whole gradient: at once.
    if (!rc.holds_tied_copy(cfg_.model) && !rc.dp) {
      deferred_norm_ = &g;
      return;
    }
    if (rc.dp) wte_work_.wait();
  }
  start_norm_sum(g);
}

void Updater::start_norm_sum(std::vector<float>& g) {
  dp_mean(g);
  {
    const Spans::Scope busy = two_bw_->update_scope(false);
    norm_buf_[0] = sum_squares(e_.model.ops(), g.data(), norm_ranges_);
  }
  norm_work_ = e_.rc.stats->all_reduce(std::span<double>(norm_buf_, 1), comm::ReduceOp::kSum, {.async = true, .lazy = true});
}

// Note [2BW without a barrier]: the first stage's squares as soon as the tied sum is through,
// mid-step, never waiting for it. Taken only at the step's end, they left every other rank's
// worker waiting on the norm's sum a whole step: on config B at pp 2 the last stage's worker
// woke every millisecond for 2.1 s of each 2.2 s step beside the stage's compute, on its core.
void Updater::poll_deferred_norm() {
  if (deferred_norm_ && wte_work_.done()) start_norm_sum(*std::exchange(deferred_norm_, nullptr));
}

// Before any other sum of the step's end, so every rank starts its sums over the stats group
// in one order (the norm, then the loss).
void Updater::start_deferred_norm() {
  if (!deferred_norm_) return;
  wte_work_.wait();
  start_norm_sum(*std::exchange(deferred_norm_, nullptr));
}

double Updater::take_pending_norm() {
  start_deferred_norm();
  wte_work_.wait();
  norm_work_.wait();
  norm_started_ = false;
  return norm_buf_[0];
}

// Note [Streams with data parallelism]: the stage replicas' mean gradient, in place (the
// bucketed sync's kAvg; no-op at dp 1 and wherever a GradSync reduces).
void Updater::dp_mean(std::vector<float>& g) {
  if (!e_.rc.dp || sync_) return;
  e_.rc.dp->all_reduce(std::span<float>(g), comm::ReduceOp::kAvg);
}

void Updater::take_earlier_loss(Result& r) {
  if (!loss_started_) return;
  loss_work_.wait();
  loss_started_ = false;
  r.has_earlier = true;
  r.earlier_loss = loss_buf_[0] / (e_.rc.dp_size * e_.rc.tp_size);
  r.earlier_norm = std::sqrt(loss_buf_[1] / e_.rc.dp_size);
}

void Updater::sum_loss(Result& r, double local_loss, double sq, bool flush) {
  const RankContext& rc = e_.rc;
  take_earlier_loss(r);
  if (flush || !rc.stats) {
    double v[2] = {local_loss, sq};
    rc.stats_sum(v);
    r.loss = v[0] / (rc.dp_size * rc.tp_size);
    r.norm = std::sqrt(v[1] / rc.dp_size);  // every dp replica counted the same gradient
  } else {
    loss_buf_[0] = local_loss, loss_buf_[1] = sq;
    loss_work_ = rc.stats->all_reduce(std::span<double>(loss_buf_, 2), comm::ReduceOp::kSum, {.async = true, .lazy = true});
    loss_started_ = r.deferred = true;
  }
}

}  // namespace loom
