#include "loom/modes/stream/two_bw.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "loom/core/error.h"

namespace loom {

TwoBwState::TwoBwState(Model& model, MemoryTracker& memory, bool pipeline, bool stash)
    : model_(model), pipeline_(pipeline),
      vocab_(model.vocab_range().count),  // a leading run (Model::vocab_range asserts offset 0)
      memory_(memory) {
  if (!pipeline_ || stash) {  // Note [Early stash]: the last stage reads none
    huge_resize(stash_, model.params().size(), 0.0f);  // Note [Huge pages]: walked whole each step
    memory.track(memory.category("params"), stash_.data(), int64_t(stash_.size() * sizeof(float)));
  }
  if (pipeline_) {
    huge_resize(pending_, model.grads().size(), 0.0f);
    memory.track(memory.category("grads"), pending_.data(), int64_t(pending_.size() * sizeof(float)));
  }
}

void TwoBwState::bind(bool previous) {
  LOOM_ASSERT(!previous || !stash_.empty(), "a trailing backward on the 2bw stage that holds no stash");
  model_.bind_params(previous ? stash_.data() : nullptr);
}

std::optional<parallel::PipelineRunner::Stream> TwoBwState::executor(int64_t step, bool flush) {
  if (!pipeline_) return std::nullopt;
  parallel::PipelineRunner::Stream o;
  o.age = started_ ? 1 : 0;
  o.flush = flush;
  o.weights = [this](int back, bool) {  // back = -1: the step is over
    if ((back > 0) != bound_previous_) bind(bound_previous_ = back > 0);
  };
  o.after_backward = [this](int) {
    if (on_backward) on_backward();
  };
  o.ahead = [this] {  // Note [The next step's first forwards ahead]
    if (updates_into_stash(flush_) && on_ahead) on_ahead();
  };
  flush_ = flush;
  pending_batch_ = step - 1;
  if (!flush && !stash_.empty())  // Note [2BW's update in the waits]
    o.before_backward = [this](int left) {
      if (has_pending_ && on_wait) on_wait(left);
    };
  parts_done_ = 0;
  // Everything after the vocabulary tensors (all of it without pp_vocab).
  o.batch_gradients = [this, flush] {
    if (!started_) return;  // the stream starts: nothing carried over
    {
      const Spans::Scope busy = update_scope(false);
      std::vector<float>& g = model_.grads();
      const auto from = g.begin() + vocab_;
      std::copy(from, g.end(), pending_.begin() + vocab_);
      // Note [Fresh gradients]: with the whole buffer moved, the linears' first backwards write
      // theirs. On config M at pp 2 the move and the zeroing took 1.9-2.0 ms a step on each
      // stage instead of 2.8-4.1, time the stage spends between two steps' lists.
      if (vocab_ == 0) model_.zero_grads();
      else std::fill(from, g.end(), 0.0f);
    }
    complete_part();
  };
  if (vocab_ > 0) vocab_hooks(o, step);
  return o;
}

// Note [Vocabulary passes in a stream]: the vocabulary tensors' part, which the step's first
// pass moves and its trailing embedding gradients then add to, and their update in a pass.
void TwoBwState::vocab_hooks(parallel::PipelineRunner::Stream& o, int64_t step) {
  o.vocab_pending = [this](bool begin) {
    if (!started_) return;
    if (!begin) return complete_part();
    const Spans::Scope busy = update_scope(false);
    float* g = model_.grads().data();
    std::copy(g, g + vocab_, pending_.data());
    std::fill(g, g + vocab_, 0.0f);
  };
  o.swap_vocab = [this] {
    float* g = model_.grads().data();
    std::swap_ranges(g, g + vocab_, pending_.data());
  };
  o.vocab_update = [this, step](bool aside) {
    if (!started_) return;  // the stream's first step: no pending gradient, no update at its end
    LOOM_ASSERT(has_pending_, "the vocabulary tensors' update before the pending gradient");
    // Note [The next step's first forwards ahead]: a stage with a stash writes W(t)'s rows into
    // the stash's, which the exchange makes the parameters' (no copy back).
    vocab_in_stash_ = aside && updates_into_stash(flush_) && !stash_taken_;
    if (aside && !vocab_in_stash_ && aside_.empty()) {
      aside_.resize(size_t(vocab_));
      memory_.track(memory_.category("params"), aside_.data(), vocab_ * int64_t(sizeof(float)));
    }
    if (on_vocab_update) on_vocab_update(pending_, step, !aside ? nullptr : vocab_in_stash_ ? &stash_ : &aside_);
    aside_live_ = aside && !vocab_in_stash_;
  };
  // Note [The next step's first forwards ahead]
  o.vocab_take = [this](bool before_head) {
    // In the stash: the head reads W(t - 1)'s rows, which the exchange, if made, left there.
    if (vocab_in_stash_ && stash_taken_) model_.bind_params(before_head ? stash_.data() : nullptr, vocab_);
    if (before_head || !aside_live_) return;  // (!aside_live_: no update this step, or it is in the stash)
    const Spans::Scope busy = update_scope(false);
    std::copy(aside_.begin(), aside_.end(), model_.params().begin());
    aside_live_ = false;
  };
  o.lookup_aside = [this](bool on) {  // the units within the vocabulary tensors: the lookup's
    // W(t)'s rows: the copy's, or the stash's until the exchange makes them the parameters'.
    float* next = aside_live_ ? aside_.data() : vocab_in_stash_ && !stash_taken_ ? stash_.data() : nullptr;
    if (next) model_.bind_params(on ? next : nullptr, vocab_);
  };
}

void TwoBwState::complete_part() {
  if (++parts_done_ < (vocab_ > 0 ? 2 : 1)) return;
  has_pending_ = true;
  if (on_pending) on_pending(pending_);
}

void TwoBwState::begin_pass() {
  if (!pipeline_ && stash_valid_) bind(true);
}

void TwoBwState::end_pass() {
  if (!pipeline_ && stash_valid_) bind(false);
}

std::vector<TwoBwState::Update> TwoBwState::updates(int64_t step, bool flush) {
  if (!pipeline_) return {{&model_.grads(), step}};
  std::vector<Update> out;
  if (has_pending_) out.push_back({&pending_, step - 1});
  if (flush) out.push_back({&model_.grads(), step});
  return out;
}

void TwoBwState::before_updates(bool flush) {
  if (flush) return;  // the next step starts the stream on the updated weights
  // Note [2BW's update in the waits]: the pending update writes the stash; else (a stream's
  // first step, nothing pending) the next step's trailing backwards read today's weights.
  if (!stash_.empty() && !updates_into_stash(flush))
    std::copy(model_.params().begin(), model_.params().end(), stash_.begin());
  stash_valid_ = true;
}

bool TwoBwState::updates_into_stash(bool flush) const {
  return pipeline_ && !flush && !stash_.empty() && has_pending_;
}

void TwoBwState::take_stash_as_params() {
  LOOM_ASSERT(updates_into_stash(flush_) && !bound_previous_, "the stash taken as the weights outside a 2bw step's end");
  // The vocabulary rows were updated in a pass (Note [Vocabulary passes across a step's end]):
  // in place, then copied to the stash's, or aside into the stash's (Note [The next step's first
  // forwards ahead]), which the exchange makes the parameters' and the parameters' (W(t - 1)'s,
  // which a later head may read) the stash's.
  if (!vocab_in_stash_) std::copy(model_.params().begin(), model_.params().begin() + vocab_, stash_.begin());
  model_.swap_params(stash_);
  stash_taken_ = true;
}

void TwoBwState::after_updates(bool flush) {
  LOOM_ASSERT(!aside_live_, "a 2bw step ended with its vocabulary update aside, not taken");
  has_pending_ = false;
  stash_taken_ = vocab_in_stash_ = false;
  started_ = !flush;
  if (flush) stash_valid_ = false;
}

}  // namespace loom
