#include "loom/modes/ps/ps_sparse.h"

#include <algorithm>
#include <cstring>

#include "loom/core/error.h"

namespace loom::parallel {

std::vector<FlatRange> dense_pieces(FlatRange range, const PsTable& t) {
  const int64_t lo = range.offset, hi = range.offset + range.count;
  if (!t.on()) return {range};
  const int64_t t0 = t.offset, t1 = t.offset + t.rows * t.width;
  std::vector<FlatRange> out;
  if (lo < std::min(hi, t0)) out.push_back({lo, std::min(hi, t0) - lo});
  if (std::max(lo, t1) < hi) out.push_back({std::max(lo, t1), hi - std::max(lo, t1)});
  return out;
}

std::vector<FlatRange> table_part(FlatRange range, const PsTable& t) {
  const int64_t lo = std::max(range.offset, t.offset), hi = std::min(range.offset + range.count, t.offset + t.rows * t.width);
  if (lo < hi) return {{lo, hi - lo}};
  return {};
}

std::vector<int32_t> rows_within(const std::vector<int32_t>& rows, FlatRange range, const PsTable& t) {
  std::vector<int32_t> out;
  for (int32_t r : rows) {
    const int64_t a = t.offset + int64_t(r) * t.width;
    if (a < range.offset + range.count && a + t.width > range.offset) out.push_back(r);
  }
  return out;
}

std::vector<FlatRange> row_pieces(const std::vector<int32_t>& rows, FlatRange range, const PsTable& t) {
  std::vector<FlatRange> out;
  const int64_t lo = range.offset, hi = range.offset + range.count;
  for (int32_t r : rows) {
    LOOM_ASSERT(r >= 0 && r < t.rows, "an embedding row outside the table");
    const int64_t a = std::max(lo, t.offset + int64_t(r) * t.width), b = std::min(hi, t.offset + int64_t(r + 1) * t.width);
    if (a < b) out.push_back({a, b - a});
  }
  return out;
}

int64_t floats_of(const std::vector<FlatRange>& ranges) {
  int64_t n = 0;
  for (const FlatRange& r : ranges) n += r.count;
  return n;
}

int64_t gather_ranges(const float* flat, const std::vector<FlatRange>& ranges, float* out) {
  int64_t at = 0;
  for (const FlatRange& r : ranges) {
    std::memcpy(out + at, flat + r.offset, size_t(r.count) * sizeof(float));
    at += r.count;
  }
  return at;
}

int64_t scatter_ranges(const float* in, const std::vector<FlatRange>& ranges, float* flat) {
  int64_t at = 0;
  for (const FlatRange& r : ranges) {
    std::memcpy(flat + r.offset, in + at, size_t(r.count) * sizeof(float));
    at += r.count;
  }
  return at;
}

void RowSet::add(const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t r = tokens[i];
    LOOM_ASSERT(r >= 0 && size_t(r) < seen_.size(), "a token outside the embedding table");
    if (!seen_[size_t(r)]) seen_[size_t(r)] = 1, list_.push_back(r);
  }
}

std::vector<int32_t> RowSet::take() {
  for (int32_t r : list_) seen_[size_t(r)] = 0;
  std::vector<int32_t> out;
  out.swap(list_);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace loom::parallel
