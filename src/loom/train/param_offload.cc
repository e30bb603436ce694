#include "loom/train/param_offload.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/optim/offload.h"

namespace loom {

ParamFetch::ParamFetch(StateFile& file, float* params, std::vector<FlatRange> units, MemoryTracker* tracker)
    : file_(file), params_(params), units_(std::move(units)), tracker_(tracker), state_(units_.size(), State::kOut),
      refs_(units_.size(), 0), ticket_(units_.size(), 0) {
  LOOM_ASSERT(units_.size() >= 2);
}

// Units in forward order: embedding (L), blocks 0..L-1, head (L + 1); the next one present
// after `unit` in `direction` (+1 forward, -1 backward), or -1.
int ParamFetch::next_unit(int unit, int direction) const {
  const int L = int(units_.size()) - 2;
  auto pos = [&](int u) { return u == L ? 0 : u == L + 1 ? L + 1 : u + 1; };
  auto unit_at = [&](int p) { return p == 0 ? L : p == L + 1 ? L + 1 : p - 1; };
  for (int p = pos(unit) + direction; p >= 0 && p <= L + 1; p += direction)
    if (units_[size_t(unit_at(p))].count > 0) return unit_at(p);
  return -1;
}

void ParamFetch::start(int unit) {
  if (state_[size_t(unit)] != State::kOut) return;
  const FlatRange& r = units_[size_t(unit)];
  ticket_[size_t(unit)] = file_.fetch(r.offset, r.count, params_ + r.offset);
  state_[size_t(unit)] = State::kReading;
  peak_ = std::max(peak_, ++in_);
}

void ParamFetch::acquire(int unit) {
  LOOM_ASSERT(unit >= 0 && unit < int(units_.size()) && units_[size_t(unit)].count > 0);
  const int L = int(units_.size()) - 2;
  auto pos = [&](int u) { return u == L ? 0 : u == L + 1 ? L + 1 : u + 1; };
  const int direction = last_ < 0 || pos(unit) >= pos(last_) ? 1 : -1;
  last_ = unit;
  start(unit);
  if (const int next = next_unit(unit, direction); next >= 0) start(next);  // read ahead
  if (state_[size_t(unit)] == State::kReading) {
    file_.wait(ticket_[size_t(unit)]);
    state_[size_t(unit)] = State::kIn;
  }
  refs_[size_t(unit)]++;
  if (tracker_) tracker_->sample();
}

void ParamFetch::release(int unit) {
  LOOM_ASSERT(refs_[size_t(unit)] > 0);
  if (--refs_[size_t(unit)] == 0) drop(unit);
}

// The unit's pages go back to the OS (its values are in the file). Partial pages at its
// ends are zeroed in place only within its range, so a neighbour being read is untouched.
void ParamFetch::drop(int unit) {
  if (state_[size_t(unit)] == State::kOut) return;
  if (state_[size_t(unit)] == State::kReading) file_.wait(ticket_[size_t(unit)]);
  const FlatRange& r = units_[size_t(unit)];
  release_pages(params_ + r.offset, r.count * int64_t(sizeof(float)));
  state_[size_t(unit)] = State::kOut;
  in_--;
}

void ParamFetch::drop_all() {
  for (int u = 0; u < int(units_.size()); u++) {
    LOOM_ASSERT(refs_[size_t(u)] == 0, "unit ", u, " is still in use at the update");
    drop(u);
  }
  last_ = -1;
}

void ParamFetch::materialize() {
  drop_all();
  for (int u = 0; u < int(units_.size()); u++)
    if (units_[size_t(u)].count > 0) start(u);
  for (int u = 0; u < int(units_.size()); u++)
    if (state_[size_t(u)] == State::kReading) file_.wait(ticket_[size_t(u)]), state_[size_t(u)] = State::kIn;
}

}  // namespace loom
