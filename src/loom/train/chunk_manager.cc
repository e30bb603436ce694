#include "loom/train/chunk_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "loom/core/error.h"
#include "loom/optim/offload.h"

namespace loom {

namespace {

// Chunk starts: every `chunk_floats` from the buffer's first page boundary (so a dropped
// chunk hands back all its pages: a page shared by two chunks would stay resident), or (0)
// each unit's start and end.
std::vector<int64_t> chunk_bounds(const float* params, const std::vector<FlatRange>& units, int64_t total,
                                  int64_t chunk_floats) {
  std::vector<int64_t> b = {0, total};
  if (chunk_floats > 0) {
    const auto page = uintptr_t(::sysconf(_SC_PAGESIZE));
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

}  // namespace

ChunkManager::ChunkManager(StateFile& file, float* params, int64_t total, std::vector<FlatRange> units,
                           int64_t chunk_floats, int64_t budget_bytes, MemoryTracker* tracker)
    : file_(file), params_(params), units_(std::move(units)), bounds_(chunk_bounds(params, units_, total, chunk_floats)),
      budget_(budget_bytes), tracker_(tracker) {
  LOOM_ASSERT(units_.size() >= 2 && total > 0 && chunk_floats >= 0);
  const size_t n = bounds_.size() - 1;
  state_.assign(n, State::kFree);
  refs_.assign(n, 0);
  ticket_.assign(n, 0);
  uses_.resize(n);
  stats_.chunk_floats = chunk_floats;
  if (tracker_) params_row_ = tracker_->category("params");
}

int64_t ChunkManager::chunk_bytes(int c) const {
  return (bounds_[size_t(c) + 1] - bounds_[size_t(c)]) * int64_t(sizeof(float));
}

int ChunkManager::first_chunk(int unit) const {
  const int64_t at = units_[size_t(unit)].offset;
  return int(std::upper_bound(bounds_.begin(), bounds_.end(), at) - bounds_.begin()) - 1;
}

int ChunkManager::last_chunk(int unit) const {
  const FlatRange& r = units_[size_t(unit)];
  return int(std::lower_bound(bounds_.begin(), bounds_.end(), r.offset + r.count) - bounds_.begin());
}

void ChunkManager::start(int c) {
  LOOM_ASSERT(state_[size_t(c)] == State::kFree);
  const int64_t at = bounds_[size_t(c)], n = bounds_[size_t(c) + 1] - at;
  ticket_[size_t(c)] = file_.fetch(at, n, params_ + at);
  state_[size_t(c)] = State::kReading;
  resident_ += chunk_bytes(c);
  stats_.reads++, stats_.read_bytes += chunk_bytes(c);
  if (phase_ == Phase::kReplaying) stats_.replayed_read_bytes += chunk_bytes(c);
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, resident_);
}

void ChunkManager::finish_read(int c) {
  if (state_[size_t(c)] != State::kReading) return;
  file_.wait(ticket_[size_t(c)]);
  state_[size_t(c)] = refs_[size_t(c)] > 0 ? State::kInUse : State::kHeld;
}

// The chunk's pages go back to the OS (its values are in the file). Partial pages at its
// ends are zeroed in place only within its range, so a neighbour being read is untouched.
void ChunkManager::drop(int c) {
  if (state_[size_t(c)] == State::kFree) return;
  LOOM_ASSERT(refs_[size_t(c)] == 0, "chunk ", c, " dropped while in use");
  finish_read(c);
  const int64_t at = bounds_[size_t(c)];
  release_pages(params_ + at, chunk_bytes(c));
  resident_ -= chunk_bytes(c);
  state_[size_t(c)] = State::kFree;
}

int64_t ChunkManager::allowance() const {
  if (!recorded_ || phase_ == Phase::kRecording || budget_ <= 0) return 0;
  return std::max<int64_t>(0, budget_ - stats_.peak_non_model_bytes);
}

// The trace event at or after pos_ that next uses chunk c (max: not again this step).
int64_t ChunkManager::next_use(int c) const {
  const std::vector<int>& u = uses_[size_t(c)];
  const auto it = std::lower_bound(u.begin(), u.end(), pos_);
  return it == u.end() ? std::numeric_limits<int64_t>::max() : *it;
}

void ChunkManager::make_room(int64_t extra) {
  const int64_t limit = allowance();
  const bool replay = phase_ == Phase::kReplaying;
  while (resident_ + extra > limit) {
    int victim = -1;
    int64_t far = -1;
    for (int c = 0; c < chunks(); c++) {
      if (state_[size_t(c)] != State::kHeld) continue;
      const int64_t next = replay ? next_use(c) : std::numeric_limits<int64_t>::max();
      if (replay && next == pos_) continue;  // the next event's: read ahead, kept
      if (next > far) far = next, victim = c;
    }
    if (victim < 0) return;
    drop(victim);
    stats_.evictions++;
  }
}

void ChunkManager::record(int unit) { trace_.push_back(unit); }

// Replaying: the expected event, or the unit searched forward (then from the start).
void ChunkManager::follow(int unit) {
  const int n = int(trace_.size());
  if (pos_ < n && trace_[size_t(pos_)] == unit) {
    pos_++;
    return;
  }
  for (int k = 1; k <= n; k++) {
    const int j = (pos_ + k) % n;
    if (trace_[size_t(j)] == unit) {
      pos_ = j + 1;
      return;
    }
  }
}

// Replaying: the chunks of the next event, where the allowance has room for them (without
// a budget always, as one event ahead is part of the minimum).
void ChunkManager::read_ahead() {
  if (phase_ != Phase::kReplaying || pos_ >= int(trace_.size())) return;
  const int unit = trace_[size_t(pos_)];
  int64_t need = 0;
  for (int c = first_chunk(unit); c < last_chunk(unit); c++)
    if (state_[size_t(c)] == State::kFree) need += chunk_bytes(c);
  if (need == 0) return;
  if (budget_ > 0) {
    make_room(need);
    if (resident_ + need > allowance()) return;
  }
  for (int c = first_chunk(unit); c < last_chunk(unit); c++)
    if (state_[size_t(c)] == State::kFree) start(c);
}

void ChunkManager::begin_step() {
  if (phase_ == Phase::kRecording) end_recording();
  measure_non_model();  // buffers the update touched first (the optimizer's slots) count too
  phase_ = recorded_ ? Phase::kReplaying : Phase::kRecording;
  if (recorded_) stats_.replayed_steps++;
  step_reads_from_ = stats_.replayed_read_bytes;
  pos_ = 0;
}

void ChunkManager::end_recording() {
  for (int i = 0; i < int(trace_.size()); i++)
    for (int c = first_chunk(trace_[size_t(i)]); c < last_chunk(trace_[size_t(i)]); c++) uses_[size_t(c)].push_back(i);
  stats_.trace_events = int(trace_.size());
  recorded_ = true;
}

void ChunkManager::acquire(int unit) {
  LOOM_ASSERT(unit >= 0 && unit < int(units_.size()) && units_[size_t(unit)].count > 0);
  if (phase_ == Phase::kRecording) record(unit);
  else if (phase_ == Phase::kReplaying) follow(unit);
  const int a = first_chunk(unit), b = last_chunk(unit);
  int64_t need = 0;
  for (int c = a; c < b; c++) {
    stats_.acquires++;
    if (refs_[size_t(c)]++ == 0 && state_[size_t(c)] == State::kHeld) state_[size_t(c)] = State::kInUse;
    if (state_[size_t(c)] == State::kFree) need += chunk_bytes(c);
    else stats_.hits++;
  }
  make_room(need);
  if (budget_ > 0 && phase_ == Phase::kReplaying && resident_ + need > allowance()) stats_.over_budget_events++;
  for (int c = a; c < b; c++)
    if (state_[size_t(c)] == State::kFree) start(c);
  read_ahead();
  for (int c = a; c < b; c++) finish_read(c);
  if (phase_ == Phase::kRecording) measure_non_model();
  else if (tracker_) tracker_->sample();
}

// What the rank holds besides parameters now: the tracker's total less its params row.
void ChunkManager::measure_non_model() {
  if (!tracker_) return;
  tracker_->sample();
  int64_t all = 0, params = 0;
  const std::vector<MemoryTracker::Row> rows = tracker_->rows();
  for (size_t r = 0; r < rows.size(); r++) {
    all += rows[r].now_bytes;
    if (int(r) == params_row_) params = rows[r].now_bytes;
  }
  stats_.peak_non_model_bytes = std::max(stats_.peak_non_model_bytes, all - params);
}

void ChunkManager::release(int unit) {
  for (int c = first_chunk(unit); c < last_chunk(unit); c++) {
    LOOM_ASSERT(refs_[size_t(c)] > 0, "chunk ", c, " of unit ", unit, " released more often than acquired");
    if (--refs_[size_t(c)] == 0 && state_[size_t(c)] == State::kInUse) state_[size_t(c)] = State::kHeld;
  }
  make_room(0);
}

void ChunkManager::end_step() {
  for (int c = 0; c < chunks(); c++) {
    LOOM_ASSERT(refs_[size_t(c)] == 0, "chunk ", c, " is still in use at the update");
    finish_read(c);  // before the update's values are copied in
  }
  if (phase_ == Phase::kRecording) end_recording();
  if (phase_ == Phase::kReplaying) stats_.last_step_read_bytes = stats_.replayed_read_bytes - step_reads_from_;
  phase_ = Phase::kIdle;
}

void ChunkManager::refresh(int64_t begin, int64_t count, const float* p) {
  const int first = int(std::upper_bound(bounds_.begin(), bounds_.end(), begin) - bounds_.begin()) - 1;
  for (int c = first; c < chunks() && bounds_[size_t(c)] < begin + count; c++) {
    if (state_[size_t(c)] == State::kFree) continue;
    LOOM_ASSERT(state_[size_t(c)] == State::kHeld, "chunk ", c, " is read or used during the update");
    const int64_t lo = std::max(begin, bounds_[size_t(c)]), hi = std::min(begin + count, bounds_[size_t(c) + 1]);
    std::memcpy(params_ + lo, p + (lo - begin), size_t(hi - lo) * sizeof(float));
  }
}

void ChunkManager::drop_all() {
  end_step();
  for (int c = 0; c < chunks(); c++) drop(c);
}

void ChunkManager::materialize() {
  drop_all();
  for (int c = 0; c < chunks(); c++) start(c);
  for (int c = 0; c < chunks(); c++) finish_read(c);
}

}  // namespace loom
