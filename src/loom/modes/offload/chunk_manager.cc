#include "loom/modes/offload/chunk_manager.h"


#include <algorithm>
#include <cstring>
#include <limits>

#include "loom/core/error.h"
#include "loom/kernels/kernels.h"
#include "loom/modes/offload/offload.h"
#include "loom/optim/optimizer.h"

namespace loom {

namespace {

// Parameter chunk starts: every `chunk_floats` from the buffer's first page boundary (so a
// dropped chunk hands back all its pages), or (0) each unit's start and end.
std::vector<int64_t> param_bounds(const float* params, const std::vector<FlatRange>& units, int64_t total,
                                  int64_t chunk_floats) {
  std::vector<int64_t> b = {0, total};
  if (chunk_floats > 0) {
    const auto page = uintptr_t(page_bytes());
    const int64_t first = int64_t((page - reinterpret_cast<uintptr_t>(params) % page) % page / sizeof(float));
    for (int64_t at = first; at < total; at += chunk_floats) b.push_back(at);
  } else {
    for (const FlatRange& r : units)
      if (r.count > 0) b.push_back(r.offset), b.push_back(r.offset + r.count);
  }
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

// Gradient chunk starts: every `chunk_floats` from element 0 (Note [Gradient chunks]).
std::vector<int64_t> grad_bounds(int64_t total, int64_t chunk_floats) {
  std::vector<int64_t> b;
  for (int64_t at = 0; at < total; at += chunk_floats) b.push_back(at);
  b.push_back(total);
  return b;
}

}  // namespace

ChunkManager::ChunkManager(StateFile& file, float* params, int64_t total, std::vector<FlatRange> units,
                           int64_t chunk_floats, int64_t budget_bytes, MemoryTracker* tracker, float* grads)
    : file_(file), params_(params), grads_(grads), units_(std::move(units)), budget_(budget_bytes),
      tracker_(tracker) {
  LOOM_ASSERT(units_.size() >= 2 && total > 0 && chunk_floats >= 0);
  bounds_[0] = param_bounds(params, units_, total, chunk_floats);
  grads_first_ = int(bounds_[0].size()) - 1;
  int n = grads_first_;
  if (grads_) {
    LOOM_ASSERT(chunk_floats > 0 && chunk_floats % kNormPiece == 0, "gradient chunks of ", chunk_floats, " floats");
    bounds_[1] = grad_bounds(total, chunk_floats);
    n += int(bounds_[1].size()) - 1;
    release_pages(grads_, total * int64_t(sizeof(float)));  // zero, stored nowhere
  }
  state_.assign(size_t(n), State::kFree);
  refs_.assign(size_t(n), 0);
  ticket_.assign(size_t(n), 0);
  spilled_.assign(size_t(n), false);
  dirty_.assign(size_t(n), false);
  uses_.resize(size_t(n));
  stats_.chunk_floats = chunk_floats;
  if (tracker_) {
    tracker_->manage(params_, total * int64_t(sizeof(float)));
    if (grads_) tracker_->manage(grads_, total * int64_t(sizeof(float)));
  }
}

ChunkManager::Tier ChunkManager::tier(int c, Kind k) const {
  const int g = id(k, c);
  if (state_[size_t(g)] != State::kFree) return Tier::kMemory;
  return is_grad(g) && !spilled_[size_t(g)] ? Tier::kNone : Tier::kDisk;
}

std::pair<int, int> ChunkManager::ids(const Event& e) const {
  if (e.kind == kUpdateGrads) return {id(kGrads, e.key), id(kGrads, e.key) + 1};
  const FlatRange& r = units_[size_t(e.key)];
  const std::vector<int64_t>& b = bounds_[e.kind == kUnitGrads ? 1 : 0];
  const int first = int(std::upper_bound(b.begin(), b.end(), r.offset) - b.begin()) - 1;
  const int last = int(std::lower_bound(b.begin(), b.end(), r.offset + r.count) - b.begin());
  const int shift = e.kind == kUnitGrads ? grads_first_ : 0;
  return {first + shift, last + shift};
}

// A chunk not resident has values to read: a parameter chunk always (the file holds them),
// a gradient chunk when it was spilled this step.
bool ChunkManager::needs_read(int g) const { return !is_grad(g) || spilled_[size_t(g)]; }

void ChunkManager::bring(int g) {
  LOOM_ASSERT(state_[size_t(g)] == State::kFree);
  resident_ += chunk_bytes(g);
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, resident_);
  if (!needs_read(g)) {  // zero pages, touched as the model writes
    state_[size_t(g)] = refs_[size_t(g)] > 0 ? State::kInUse : State::kHeld;
    return;
  }
  const int64_t at = begin_of(g), n = end_of(g) - at;
  state_[size_t(g)] = State::kReading;
  if (is_grad(g)) {
    ticket_[size_t(g)] = file_.spill(false, at, n, grads_ + at);
    stats_.grad_read_bytes += chunk_bytes(g);
    return;
  }
  ticket_[size_t(g)] = file_.fetch(at, n, params_ + at);
  stats_.reads++, stats_.read_bytes += chunk_bytes(g);
  if (phase_ == Phase::kReplaying) stats_.replayed_read_bytes += chunk_bytes(g);
}

void ChunkManager::wait(int64_t ticket, const char* what) {
  if (span_) span_(what, true);
  file_.wait(ticket);
  if (span_) span_(what, false);
}

void ChunkManager::finish_read(int g) {
  if (state_[size_t(g)] != State::kReading) return;
  wait(ticket_[size_t(g)], is_grad(g) ? "gradient read-back" : "parameter read");
  state_[size_t(g)] = refs_[size_t(g)] > 0 ? State::kInUse : State::kHeld;
}

// The chunk's pages go back to the OS. keep_values: a gradient chunk written since its last
// spill is spilled first (parameters are always in the file; a clean gradient chunk is zero
// or its spill is current); else its values are dead (consumed, or a new step).
// Pages it shares with a free neighbour go too (a free chunk's bytes are never read
// before it is brought back); partial pages otherwise are zeroed in place within its range.
void ChunkManager::drop(int g, bool keep_values) {
  if (state_[size_t(g)] == State::kFree) return;
  LOOM_ASSERT(refs_[size_t(g)] == 0, "chunk ", g, " dropped while in use");
  finish_read(g);
  int64_t lo = begin_of(g), hi = end_of(g);
  if (is_grad(g)) {
    if (keep_values && dirty_[size_t(g)]) {
      wait(file_.spill(true, lo, hi - lo, grads_ + lo), "gradient spill");
      stats_.grad_written_bytes += chunk_bytes(g);
      spilled_[size_t(g)] = true;
    }
    if (!keep_values) spilled_[size_t(g)] = false;
    dirty_[size_t(g)] = false;
  }
  // Out to the page boundaries (in address space) inside a free neighbour; never zeroing a
  // free neighbour's bytes in a page that stays, which would make that page resident again.
  const auto page = uintptr_t(page_bytes());
  const auto addr = [&](int64_t i) { return reinterpret_cast<uintptr_t>(base(g) + i); };
  const int first = is_grad(g) ? grads_first_ : 0, last = is_grad(g) ? int(state_.size()) : grads_first_;
  if (const uintptr_t down = addr(lo) / page * page;
      g > first && state_[size_t(g) - 1] == State::kFree && down >= addr(begin_of(g - 1)))
    lo -= int64_t((addr(lo) - down) / sizeof(float));
  if (const uintptr_t up = (addr(hi) + page - 1) / page * page;
      g + 1 < last && state_[size_t(g) + 1] == State::kFree && up <= addr(end_of(g + 1)))
    hi += int64_t((up - addr(hi)) / sizeof(float));
  release_pages(base(g) + lo, (hi - lo) * int64_t(sizeof(float)));
  resident_ -= chunk_bytes(g);
  state_[size_t(g)] = State::kFree;
}

int64_t ChunkManager::allowance() const {
  if (!recorded_ || phase_ == Phase::kRecording || budget_ <= 0) return 0;
  // 1% of the budget is slack: the rest moves by a few pages from step to step (ZeRO-3
  // hands a unit's gradient pages back a little earlier or later).
  return std::max<int64_t>(0, budget_ - budget_ / 100 - stats_.peak_non_model_bytes);
}

// The trace event at or after pos_ that next uses chunk g (max: not again this step).
int64_t ChunkManager::next_use(int g) const {
  const std::vector<int>& u = uses_[size_t(g)];
  const auto it = std::lower_bound(u.begin(), u.end(), pos_);
  return it == u.end() ? std::numeric_limits<int64_t>::max() : *it;
}

void ChunkManager::make_room(int64_t extra) {
  const int64_t limit = allowance();
  const bool replay = phase_ == Phase::kReplaying;
  while (resident_ + extra > limit) {
    int victim = -1;
    int64_t far = -1;
    for (int g = 0; g < int(state_.size()); g++) {
      if (state_[size_t(g)] != State::kHeld) continue;
      const int64_t next = replay ? next_use(g) : std::numeric_limits<int64_t>::max();
      if (replay && next == pos_) continue;  // the next event's: read ahead, kept
      if (next > far) far = next, victim = g;
    }
    if (victim < 0) return;
    drop(victim, true);
    stats_.evictions++;
  }
}

// Recording: appends the event. Replaying: the expected event, or the event searched
// forward (then from the start).
void ChunkManager::note(const Event& e) {
  if (phase_ == Phase::kRecording) {
    trace_.push_back(e);
    return;
  }
  if (phase_ != Phase::kReplaying) return;
  const int n = int(trace_.size());
  if (pos_ < n && trace_[size_t(pos_)] == e) {
    pos_++;
    return;
  }
  for (int k = 1; k <= n; k++) {
    const int j = (pos_ + k) % n;
    if (trace_[size_t(j)] == e) {
      pos_ = j + 1;
      return;
    }
  }
}

// Replaying: the chunks of the next event, where the allowance has room for them (without
// a budget always, as one event ahead is part of the minimum).
void ChunkManager::read_ahead() {
  if (phase_ != Phase::kReplaying || pos_ >= int(trace_.size())) return;
  const auto [a, b] = ids(trace_[size_t(pos_)]);
  int64_t need = 0;
  for (int g = a; g < b; g++)
    if (state_[size_t(g)] == State::kFree && needs_read(g)) need += chunk_bytes(g);
  if (need == 0) return;
  if (budget_ > 0) {
    make_room(need);
    if (resident_ + need > allowance()) return;
  }
  for (int g = a; g < b; g++)
    if (state_[size_t(g)] == State::kFree && needs_read(g)) bring(g);
}

void ChunkManager::begin_step() {
  if (phase_ == Phase::kRecording) end_recording();
  for (int g = grads_first_; g < int(state_.size()); g++) {  // gradients start at zero
    LOOM_ASSERT(refs_[size_t(g)] == 0);
    finish_read(g);
    if (state_[size_t(g)] != State::kFree)  // kept resident: zeroed in place, as zero_grads does
      std::memset(grads_ + begin_of(g), 0, size_t(chunk_bytes(g)));
    spilled_[size_t(g)] = dirty_[size_t(g)] = false;
  }
  measure_non_model();  // buffers the update touched first (the optimizer's slots) count too
  phase_ = recorded_ ? Phase::kReplaying : Phase::kRecording;
  if (recorded_) stats_.replayed_steps++;
  step_reads_from_ = stats_.replayed_read_bytes;
  pos_ = 0;
  update_done_ = update_next_ = 0;
}

void ChunkManager::end_recording() {
  for (int i = 0; i < int(trace_.size()); i++) {
    const auto [a, b] = ids(trace_[size_t(i)]);
    for (int g = a; g < b; g++) uses_[size_t(g)].push_back(i);
  }
  stats_.trace_events = int(trace_.size());
  recorded_ = true;
}

void ChunkManager::use(const Event& e, bool acquire) {
  LOOM_ASSERT(e.kind == kUpdateGrads || (e.key >= 0 && e.key < int(units_.size()) && units_[size_t(e.key)].count > 0));
  LOOM_ASSERT(e.kind == kUnitParams || grads_, "gradient chunks are not managed");
  const auto [a, b] = ids(e);
  if (!acquire) {
    for (int g = a; g < b; g++) {
      LOOM_ASSERT(refs_[size_t(g)] > 0, "chunk ", g, " released more often than acquired");
      if (--refs_[size_t(g)] == 0 && state_[size_t(g)] == State::kInUse) state_[size_t(g)] = State::kHeld;
    }
    make_room(0);
    return;
  }
  note(e);
  int64_t need = 0;
  for (int g = a; g < b; g++) {
    stats_.acquires++;
    if (e.kind == kUnitGrads) dirty_[size_t(g)] = true;  // the model writes it
    if (refs_[size_t(g)]++ == 0 && state_[size_t(g)] == State::kHeld) state_[size_t(g)] = State::kInUse;
    if (state_[size_t(g)] == State::kFree) need += chunk_bytes(g);
    else stats_.hits++;
  }
  make_room(need);
  if (budget_ > 0 && phase_ == Phase::kReplaying && resident_ + need > allowance()) stats_.over_budget_events++;
  for (int g = a; g < b; g++)
    if (state_[size_t(g)] == State::kFree) bring(g);
  read_ahead();
  for (int g = a; g < b; g++) finish_read(g);
  if (phase_ == Phase::kRecording) measure_non_model();
  else if (tracker_) tracker_->sample();
}

// What the rank held besides the managed chunks at any sample so far (the tracker measures
// the rest at every sample - the trainer's, the gradient sync's, ours - so the moments
// between acquires count: with ZeRO-3 a unit's whole gradients before their reduce-scatter).
void ChunkManager::measure_non_model() {
  if (!tracker_) return;
  tracker_->sample();
  stats_.peak_non_model_bytes = std::max(stats_.peak_non_model_bytes, tracker_->peak_rest());
}

void ChunkManager::begin_update() {
  for (int g = 0; g < int(state_.size()); g++) {
    LOOM_ASSERT(refs_[size_t(g)] == 0, "chunk ", g, " is still in use at the update");
    finish_read(g);  // before the update's values are copied in
  }
}

// Note [Norm pieces]: the pieces of each range, in order, never straddle a chunk (chunks are
// a whole number of pieces from element 0), so the running double sees the same additions.
double ChunkManager::grad_sum_squares(const Kernels& k, const std::vector<FlatRange>& ranges) {
  LOOM_ASSERT(grads_);
  double s = 0;
  for (int c = 0; c < chunks(kGrads); c++) {
    const int g = id(kGrads, c);
    std::vector<FlatRange> in;  // the ranges' parts inside the chunk, in order
    for (const FlatRange& r : ranges) {
      const int64_t lo = std::max(r.offset, begin_of(g)), hi = std::min(r.offset + r.count, end_of(g));
      if (hi > lo) in.push_back({lo, hi - lo});
    }
    if (in.empty()) continue;
    use({kUpdateGrads, c}, true);
    for (const FlatRange& r : in) add_sum_squares(k, grads_, r, s);
    use({kUpdateGrads, c}, false);
  }
  return s;
}

// Gradient chunk c, taken by the update, is used up: clean (its values are dead, so evicting
// it spills nothing) and released; its pages stay for the next step's zeroing where the
// budget has room.
void ChunkManager::consumed(int c) {
  dirty_[size_t(id(kGrads, c))] = false;
  use({kUpdateGrads, c}, false);
}

void ChunkManager::grads_for_update(int64_t begin, int64_t count) {
  LOOM_ASSERT(grads_);
  for (; update_done_ < update_next_ && end_of(id(kGrads, update_done_)) <= begin; update_done_++)
    consumed(update_done_);
  for (; update_next_ < chunks(kGrads) && begin_of(id(kGrads, update_next_)) < begin + count; update_next_++)
    use({kUpdateGrads, update_next_}, true);
}

void ChunkManager::refresh(int64_t begin, int64_t count, const float* p) {
  const std::vector<int64_t>& b = bounds_[0];
  const int first = int(std::upper_bound(b.begin(), b.end(), begin) - b.begin()) - 1;
  for (int c = first; c < grads_first_ && b[size_t(c)] < begin + count; c++) {
    if (state_[size_t(c)] == State::kFree) continue;
    LOOM_ASSERT(state_[size_t(c)] == State::kHeld, "chunk ", c, " is read or used during the update");
    const int64_t lo = std::max(begin, b[size_t(c)]), hi = std::min(begin + count, b[size_t(c) + 1]);
    std::memcpy(params_ + lo, p + (lo - begin), size_t(hi - lo) * sizeof(float));
  }
}

void ChunkManager::end_step() {
  for (; update_done_ < update_next_; update_done_++) consumed(update_done_);  // the update's last ones
  begin_update();
  for (int g = grads_first_; g < int(state_.size()); g++)  // the step's gradients are dead (kept pages: zeroed next)
    spilled_[size_t(g)] = dirty_[size_t(g)] = false;
  make_room(0);
  if (phase_ == Phase::kRecording) end_recording();
  if (phase_ == Phase::kReplaying) stats_.last_step_read_bytes = stats_.replayed_read_bytes - step_reads_from_;
  phase_ = Phase::kIdle;
}

void ChunkManager::drop_all() {
  end_step();
  for (int g = 0; g < int(state_.size()); g++) drop(g, false);
}

void ChunkManager::materialize() {
  drop_all();
  for (int c = 0; c < grads_first_; c++) bring(c);
  for (int c = 0; c < grads_first_; c++) finish_read(c);
}

}  // namespace loom
