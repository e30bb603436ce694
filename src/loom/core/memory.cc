#include "loom/core/memory.h"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "loom/core/error.h"

namespace loom {

int64_t page_bytes() {
  static const int64_t page = ::sysconf(_SC_PAGESIZE);
  return page;
}

void release_pages(void* p, int64_t bytes) {
  const int64_t page = page_bytes();
  const auto lo = (reinterpret_cast<uintptr_t>(p) + uintptr_t(page) - 1) / uintptr_t(page) * uintptr_t(page);
  const auto hi = (reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes)) / uintptr_t(page) * uintptr_t(page);
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + uintptr_t(bytes);
  if (bytes <= 0) return;
  if (hi <= lo) {
    std::memset(p, 0, size_t(bytes));
    return;
  }
  std::memset(p, 0, lo - begin);
  std::memset(reinterpret_cast<void*>(hi), 0, end - hi);
  LOOM_ASSERT(::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) == 0);
}

int64_t malloc_mapped_bytes() { return int64_t(::mallinfo2().hblkhd); }

void advise_huge_pages(void* p, int64_t bytes, bool own_mapping) {
  // glibc serves blocks up to its largest mmap threshold (32 MiB on 64-bit) from heaps whose
  // address ranges later hold other buffers, and the advice stays with the range: a ZeRO
  // gradient buffer landing there would fault whole huge pages back in where it hands pages
  // back. Larger blocks are mappings of their own, unmapped when freed, advice and all; so is
  // a smaller one its caller saw malloc map for it (own_mapping).
  constexpr int64_t kOwnMapping = int64_t(64) << 20;
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (bytes < (own_mapping ? int64_t(kHuge) : kOwnMapping)) return;
  const auto lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) / kHuge * kHuge;
  const auto hi = (reinterpret_cast<uintptr_t>(p) + uintptr_t(std::max<int64_t>(bytes, 0))) / kHuge * kHuge;
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // a hint (Note [Huge pages])
}

int64_t resident_bytes(const void* p, int64_t bytes) {
  const int64_t page = page_bytes();
  const auto lo = reinterpret_cast<uintptr_t>(p) / uintptr_t(page) * uintptr_t(page);
  const auto hi = (reinterpret_cast<uintptr_t>(p) + uintptr_t(bytes) + uintptr_t(page) - 1) / uintptr_t(page) *
                  uintptr_t(page);
  if (bytes <= 0) return 0;
  std::vector<unsigned char> vec(size_t((hi - lo) / uintptr_t(page)));
  // mincore may fail with EAGAIN ("temporarily out of resources"), and counting the whole
  // buffer then inflates the peak, so it is retried. (A buffer the allocator serves from heap
  // pages an earlier one touched reads as resident too: allocations counted this way hand
  // their pages back first, as the model's activation storage does.)
  int rc = -1;
  for (int attempt = 0; attempt < 8 && rc != 0; attempt++) {
    rc = ::mincore(reinterpret_cast<void*>(lo), hi - lo, vec.data());
    if (rc != 0 && errno != EAGAIN) break;
  }
  if (rc != 0) return bytes;  // unknown: count it all
  int64_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return std::min(bytes, n * page);
}

int MemoryTracker::category(const std::string& name) {
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it != names_.end()) return int(it - names_.begin());
  names_.push_back(name);
  peak_.push_back(0);
  now_.push_back(0);
  return int(names_.size()) - 1;
}

void MemoryTracker::track(int category, const void* p, int64_t bytes) {
  LOOM_ASSERT(category >= 0 && category < int(names_.size()));
  if (bytes > 0) ranges_.push_back({category, p, bytes});
}

void MemoryTracker::sample() {
  std::fill(now_.begin(), now_.end(), 0);
  for (const Range& r : ranges_) now_[size_t(r.category)] += resident_bytes(r.p, r.bytes);
  int64_t total = 0;
  for (size_t i = 0; i < now_.size(); i++) peak_[i] = std::max(peak_[i], now_[i]), total += now_[i];
  peak_total_ = std::max(peak_total_, total);
  for (const Range& r : managed_) total -= resident_bytes(r.p, r.bytes);
  peak_rest_ = std::max(peak_rest_, total);
  if (listener_) listener_(*this);
}

void MemoryTracker::manage(const void* p, int64_t bytes) { managed_.push_back({-1, p, bytes}); }

std::vector<MemoryTracker::Row> MemoryTracker::rows() const {
  std::vector<Row> out;
  for (size_t i = 0; i < names_.size(); i++) out.push_back({names_[i], peak_[i], now_[i]});
  return out;
}

}  // namespace loom
