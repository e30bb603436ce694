#include "loom/parallel/zero.h"

#include "loom/core/error.h"

namespace loom::parallel {

DataParallelPlan plan_units(const ModelConfig& m, int dp, const ModelPart& part, std::vector<int>* unit_bucket) {
  const ParamLayout base(m, {}, part);
  const auto& specs = base.specs();
  const int L = int(m.layers), n = int(specs.size());
  int first_block = n;
  for (int i = 0; i < n && first_block == n; i++)
    if (specs[size_t(i)].layer >= 0) first_block = i;
  auto unit_of = [&](int i) { return specs[size_t(i)].layer >= 0 ? specs[size_t(i)].layer : i < first_block ? L : L + 1; };
  // Runs of equal unit, last first (launch order).
  std::vector<Bucket> buckets;
  unit_bucket->assign(size_t(L + 2), -1);
  for (int hi = n - 1; hi >= 0;) {
    int lo = hi;
    while (lo > 0 && unit_of(lo - 1) == unit_of(hi)) lo--;
    (*unit_bucket)[size_t(unit_of(hi))] = int(buckets.size());
    buckets.push_back({0, 0, lo, hi});
    hi = lo - 1;
  }
  return plan_from_buckets(m, dp, true, part, std::move(buckets));
}

ParamGather::ParamGather(comm::Group& dp, const DataParallelPlan& plan, std::vector<int> unit_bucket, float* params,
                         MemoryTracker* tracker)
    : dp_(dp), plan_(plan), unit_bucket_(std::move(unit_bucket)), params_(params), tracker_(tracker),
      state_(unit_bucket_.size(), State::kShard), refs_(unit_bucket_.size(), 0), work_(unit_bucket_.size()) {
  invalidate();
}

// Units in forward order: embedding (layers), blocks 0..layers-1, head (layers + 1).
int ParamGather::next_unit(int unit, int direction) const {
  const int L = int(unit_bucket_.size()) - 2;
  auto pos = [&](int u) { return u == L ? 0 : u == L + 1 ? L + 1 : u + 1; };
  auto unit_at = [&](int p) { return p == 0 ? L : p == L + 1 ? L + 1 : p - 1; };
  for (int p = pos(unit) + direction; p >= 0 && p <= L + 1; p += direction)
    if (unit_bucket_[size_t(unit_at(p))] >= 0) return unit_at(p);
  return -1;
}

void ParamGather::start_gather(int unit) {
  if (state_[size_t(unit)] != State::kShard) return;
  const Bucket& b = plan_.buckets[size_t(unit_bucket_[size_t(unit)])];
  const int64_t piece = b.count / plan_.dp;
  std::span<float> all(params_ + b.offset, size_t(b.count));
  work_[size_t(unit)] = dp_.all_gather(std::span<const float>(all.subspan(size_t(dp_.group_rank() * piece), size_t(piece))),
                                       all, {.async = true});
  state_[size_t(unit)] = State::kGathering;
  peak_units_ = std::max(peak_units_, ++gathered_);
}

void ParamGather::acquire(int unit) {
  LOOM_ASSERT(unit >= 0 && unit < int(unit_bucket_.size()) && unit_bucket_[size_t(unit)] >= 0);
  const int L = int(unit_bucket_.size()) - 2;
  auto pos = [&](int u) { return u == L ? 0 : u == L + 1 ? L + 1 : u + 1; };
  const int direction = last_unit_ < 0 || pos(unit) >= pos(last_unit_) ? 1 : -1;
  last_unit_ = unit;
  start_gather(unit);
  if (const int next = next_unit(unit, direction); next >= 0) start_gather(next);  // prefetch
  if (state_[size_t(unit)] == State::kGathering) {
    work_[size_t(unit)].wait();
    state_[size_t(unit)] = State::kGathered;
  }
  refs_[size_t(unit)]++;
  if (tracker_) tracker_->sample();
}

void ParamGather::release(int unit) {
  LOOM_ASSERT(refs_[size_t(unit)] > 0);
  if (--refs_[size_t(unit)] == 0 && state_[size_t(unit)] != State::kShard) drop(unit);
}

// Back to the own piece: the rest of the unit's range reads zero and leaves memory.
void ParamGather::drop(int unit) {
  work_[size_t(unit)].wait();
  const Bucket& b = plan_.buckets[size_t(unit_bucket_[size_t(unit)])];
  const int64_t piece = b.count / plan_.dp, own = b.offset + dp_.group_rank() * piece;
  release_pages(params_ + b.offset, (own - b.offset) * int64_t(sizeof(float)));
  release_pages(params_ + own + piece, (b.offset + b.count - own - piece) * int64_t(sizeof(float)));
  if (state_[size_t(unit)] != State::kShard) gathered_--;
  state_[size_t(unit)] = State::kShard;
}

void ParamGather::invalidate() {
  for (int u = 0; u < int(unit_bucket_.size()); u++) {
    if (unit_bucket_[size_t(u)] < 0) continue;
    LOOM_ASSERT(refs_[size_t(u)] == 0);
    drop(u);  // also at construction: the whole buffer was written by init
  }
  last_unit_ = -1;
}

void ParamGather::gather_all() {
  for (int u = 0; u < int(unit_bucket_.size()); u++)
    if (unit_bucket_[size_t(u)] >= 0) start_gather(u);
  for (int u = 0; u < int(unit_bucket_.size()); u++)
    if (state_[size_t(u)] == State::kGathering) work_[size_t(u)].wait(), state_[size_t(u)] = State::kGathered;
}

}  // namespace loom::parallel
