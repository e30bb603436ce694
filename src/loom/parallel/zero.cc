#include "loom/parallel/zero.h"

#include <algorithm>

#include "loom/comm/algorithms.h"
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
                         Bind bind, MemoryTracker* tracker, std::vector<bool> keep, comm::Compression codec,
                         comm::Group* node)
    : dp_(dp), plan_(plan), unit_bucket_(std::move(unit_bucket)), params_(params), bind_(std::move(bind)),
      tracker_(tracker), state_(unit_bucket_.size(), State::kShard), refs_(unit_bucket_.size(), 0),
      keep_(std::move(keep)), work_(unit_bucket_.size()), codec_(codec), slot_of_(unit_bucket_.size(), -1) {
  keep_.resize(unit_bucket_.size(), false);
  node_ = node;
  has_secondary_.assign(unit_bucket_.size(), false);
  decode_.assign(unit_bucket_.size(), false);
  secondary_.resize(unit_bucket_.size());
  for (int u = 0; node_ && u < int(unit_bucket_.size()); u++) {
    if (unit_bucket_[size_t(u)] < 0 || keep_[size_t(u)]) continue;
    const int64_t count = plan_.buckets[size_t(unit_bucket_[size_t(u)])].count;
    LOOM_CHECK(count % node_->size() == 0, "hpZ splits a unit of ", count, " floats over ", node_->size(),
               " ranks of a host; it needs a dp group with the same number of ranks on every host");
    secondary_[size_t(u)].assign(size_t(count / node_->size()), 0.0f);
    if (tracker_)
      tracker_->track(tracker_->category("params"), secondary_[size_t(u)].data(),
                      int64_t(secondary_[size_t(u)].size() * sizeof(float)));
  }
  // init wrote the whole flat buffer: keep only the own pieces resident.
  for (const Bucket& b : plan_.buckets) release_unowned(b, plan_.dp, dp_.group_rank(), params_);
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
  const FlatRange mine = own_piece(b, plan_.dp, dp_.group_rank());
  const int64_t piece = mine.count;
  // The smallest free pool buffer that fits without being more than twice the unit (a
  // block must not sit in the embedding's buffer), or a new one of this unit's size: the
  // pool grows to the units held at once (current, prefetched, GPT's tied head + embedding).
  int slot = -1;
  for (int i = 0; i < int(pool_.size()); i++) {
    const int64_t cap = int64_t(pool_[size_t(i)].size());
    if (slot_user_[size_t(i)] < 0 && cap >= b.count && cap <= 2 * b.count &&
        (slot < 0 || pool_[size_t(i)].size() < pool_[size_t(slot)].size()))
      slot = i;
  }
  if (slot < 0) {
    slot = int(pool_.size());
    pool_.emplace_back(size_t(b.count), 0.0f);
    slot_user_.push_back(-1);
    if (tracker_) tracker_->track(tracker_->category("params"), pool_.back().data(), b.count * int64_t(sizeof(float)));
    if (codec_ != comm::Compression::kNone) {
      const size_t wire = comm::compressed_bytes(codec_, size_t(piece));
      pool_w_.emplace_back(wire * size_t(plan_.dp));
      own_w_.emplace_back(wire);
      if (tracker_)
        for (const auto* v : {&pool_w_.back(), &own_w_.back()})
          tracker_->track(tracker_->category("buffers"), v->data(), int64_t(v->size()));
    }
  }
  std::vector<float>& buf = pool_[size_t(slot)];
  slot_user_[size_t(slot)] = unit;
  slot_of_[size_t(unit)] = slot;
  std::span<float> all(buf.data(), size_t(b.count));
  const float* own = params_ + mine.offset;
  if (own_ && !from_node(unit)) own = own_(unit, true), own_held_[size_t(unit)] = true;
  decode_[size_t(unit)] = codec_ != comm::Compression::kNone && !from_node(unit);
  (from_node(unit) ? host_gathers_ : dp_gathers_)++;
  if (from_node(unit)) {  // Note [hpZ]: this step's values, from the host's ranks
    work_[size_t(unit)] = node_->all_gather(std::span<const float>(secondary_[size_t(unit)]), all, {.async = true});
  } else if (codec_ != comm::Compression::kNone) {  // Note [bf16 parameter gathers]; decoded in acquire()
    const size_t wire = comm::compressed_bytes(codec_, size_t(piece));
    uint8_t* own_w = own_w_[size_t(slot)].data();
    comm::compress(codec_, own, size_t(piece), reinterpret_cast<std::byte*>(own_w));
    work_[size_t(unit)] = dp_.all_gather(std::span<const uint8_t>(own_w, wire),
                                         std::span<uint8_t>(pool_w_[size_t(slot)].data(), wire * size_t(plan_.dp)),
                                         {.async = true});
  } else {
    work_[size_t(unit)] = dp_.all_gather(std::span<const float>(own, size_t(piece)), all, {.async = true});
  }
  bind_(unit, buf.data());
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
    finish_gather(unit);
    if (decode_[size_t(unit)]) {  // every rank's piece, own included
      const int slot = slot_of_[size_t(unit)];
      const int64_t piece = own_piece(plan_.buckets[size_t(unit_bucket_[size_t(unit)])], plan_.dp, 0).count;
      const size_t wire = comm::compressed_bytes(codec_, size_t(piece));
      for (int r = 0; r < plan_.dp; r++)
        comm::decompress(codec_, reinterpret_cast<const std::byte*>(pool_w_[size_t(slot)].data()) + size_t(r) * wire,
                         size_t(piece),
                         pool_[size_t(slot)].data() + r * piece);
    }
    state_[size_t(unit)] = State::kGathered;
  }
  refs_[size_t(unit)]++;
  if (tracker_) tracker_->sample();
}

void ParamGather::set_own_pieces(OwnPiece own) {
  LOOM_ASSERT(gathered_ == 0, "the own pieces move while ", gathered_, " units are gathered");
  own_ = std::move(own);
  own_held_.assign(unit_bucket_.size(), false);
}

void ParamGather::finish_gather(int unit) {
  work_[size_t(unit)].wait();
  if (own_ && own_held_[size_t(unit)]) {
    own_held_[size_t(unit)] = false;
    own_(unit, false);
  }
}

void ParamGather::release(int unit) {
  LOOM_ASSERT(refs_[size_t(unit)] > 0);
  if (--refs_[size_t(unit)] == 0 && state_[size_t(unit)] != State::kShard && !keep_[size_t(unit)]) drop(unit);
}

// Back to the own piece: the pool buffer is freed for the next unit, or (after
// gather_all) the rest of the unit's flat range reads zero and leaves memory.
void ParamGather::drop(int unit) {
  finish_gather(unit);
  if (const int slot = slot_of_[size_t(unit)]; slot >= 0) {
    // hpZ: keep this rank's slice of the gathered unit for the step's later gathers.
    if (node_ && !has_secondary_[size_t(unit)] && !secondary_[size_t(unit)].empty() &&
        state_[size_t(unit)] == State::kGathered) {
      std::vector<float>& sec = secondary_[size_t(unit)];
      const float* from = pool_[size_t(slot)].data() + size_t(node_->group_rank()) * sec.size();
      std::copy(from, from + sec.size(), sec.begin());
      has_secondary_[size_t(unit)] = true;
    }
    slot_user_[size_t(slot)] = -1;
    slot_of_[size_t(unit)] = -1;
    bind_(unit, nullptr);
  } else if (state_[size_t(unit)] != State::kShard) {
    release_unowned(plan_.buckets[size_t(unit_bucket_[size_t(unit)])], plan_.dp, dp_.group_rank(), params_);
  }
  if (state_[size_t(unit)] != State::kShard) gathered_--;
  state_[size_t(unit)] = State::kShard;
}

void ParamGather::invalidate() {
  for (int u = 0; u < int(unit_bucket_.size()); u++) {
    if (unit_bucket_[size_t(u)] < 0) continue;
    LOOM_ASSERT(refs_[size_t(u)] == 0);
    drop(u);
  }
  has_secondary_.assign(has_secondary_.size(), false);
  last_unit_ = -1;
}

int64_t ParamGather::pool_bytes() const {
  int64_t n = 0;
  for (const auto& b : pool_) n += int64_t(b.size() * sizeof(float));
  return n;
}

void ParamGather::gather_all(const float* packed) {
  invalidate();
  gather_pieces(dp_, plan_, params_, packed);
  for (int u = 0; u < int(unit_bucket_.size()); u++)
    if (unit_bucket_[size_t(u)] >= 0) state_[size_t(u)] = State::kGathered, gathered_++;
}

}  // namespace loom::parallel
