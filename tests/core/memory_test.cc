// Resident memory (Note [Resident memory]): handing pages back, counting them with mincore,
// and the tracker's per-category and managed peaks.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstring>

#include "loom/core/memory.h"

namespace loom {
namespace {

// Page-aligned anonymous memory, untouched (nothing resident) until written.
struct Pages {
  explicit Pages(int64_t n) : bytes(n * page_bytes()) {
    p = static_cast<char*>(::mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~Pages() { ::munmap(p, size_t(bytes)); }
  int64_t bytes;
  char* p;
};

TEST(ResidentMemory, ReleaseZeroesAndHandsBackWholePages) {
  const int64_t page = page_bytes();
  Pages m(4);
  ASSERT_NE(m.p, MAP_FAILED);
  EXPECT_EQ(resident_bytes(m.p, m.bytes), 0);
  std::memset(m.p, 7, size_t(m.bytes));
  EXPECT_EQ(resident_bytes(m.p, m.bytes), 4 * page);
  // From the middle of page 0 to the middle of page 3: pages 1 and 2 go, the partial ends
  // are zeroed in place and stay.
  release_pages(m.p + page / 2, 3 * page);
  EXPECT_EQ(resident_bytes(m.p, m.bytes), 2 * page);
  EXPECT_EQ(m.p[page / 2 - 1], 7);
  EXPECT_EQ(m.p[page / 2], 0);
  EXPECT_EQ(m.p[2 * page], 0);  // reads zero (and faults that page back in)
  EXPECT_EQ(m.p[3 * page + page / 2 - 1], 0);
  EXPECT_EQ(m.p[3 * page + page / 2], 7);
}

// peak_total is the most held at one sample; peak_rest leaves out the managed buffers'
// resident pages (Note [Chunk manager]), at every sample.
TEST(MemoryTracker, PeaksPerCategoryAtOnceAndBesidesManagedBuffers) {
  const int64_t page = page_bytes();
  Pages params(4), acts(2);
  MemoryTracker t;
  const int p = t.category("params"), a = t.category("activations");
  EXPECT_EQ(t.category("params"), p);
  t.track(p, params.p, params.bytes);
  t.track(a, acts.p, acts.bytes);
  t.manage(params.p + page, 2 * page);  // pages 1 and 2 of params are someone's to keep in budget
  std::memset(params.p, 1, size_t(params.bytes));
  t.sample();  // params 4, managed 2 of them: rest 2
  release_pages(params.p, params.bytes);
  std::memset(acts.p, 1, size_t(acts.bytes));
  t.sample();  // activations 2: rest 2
  std::memset(params.p + page, 1, size_t(page));
  t.sample();  // 3 pages, one managed: rest 2
  const std::vector<MemoryTracker::Row> rows = t.rows();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[size_t(p)].peak_bytes, 4 * page);
  EXPECT_EQ(rows[size_t(p)].now_bytes, page);
  EXPECT_EQ(rows[size_t(a)].peak_bytes, 2 * page);
  EXPECT_EQ(t.peak_total(), 4 * page);
  EXPECT_EQ(t.peak_rest(), 2 * page);
}

}  // namespace
}  // namespace loom
