// Note [Chunk manager]: chunk states and tiers, the warm-up trace, Belady eviction under a
// budget, the non-model memory the warm-up measures, and the values every acquire sees.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "loom/kernels/kernels.h"
#include "loom/modes/offload/offload.h"
#include "loom/optim/optimizer.h"
#include "loom/modes/offload/chunk_manager.h"
#include "support/temp_dir.h"

namespace loom {
namespace {

using testing_support::TempDir;
using State = ChunkManager::State;

// Two blocks and the embedding and head units of a tiny model's flat buffer (6,144
// floats): embedding [0, 1024), block 0 [1024, 3072), block 1 [3072, 5120), head [5120, 6144).
// Units are numbered as the model does: blocks 0 and 1, embedding 2, head 3.
constexpr int64_t kTotal = 6144;
const std::vector<FlatRange> kUnits = {{1024, 2048}, {3072, 2048}, {0, 1024}, {5120, 1024}};
constexpr int kEmbed = 2, kHead = 3;
// One step's accesses: forward embedding, blocks, head; backward head, blocks, embedding.
const std::vector<int> kStep = {kEmbed, 0, 1, kHead, kHead, 1, 0, kEmbed};

// A budget whose allowance (less the manager's 1% slack) is at least `bytes` and less than
// a chunk more.
int64_t with_slack(int64_t bytes) { return bytes * 100 / 99 + 100; }

struct Fixture {
  TempDir dir{"loom-chunks"};
  StateFile file{dir.path.string(), 0, kTotal, 1024, 2, false, 3};
  float* params = static_cast<float*>(std::aligned_alloc(4096, kTotal * sizeof(float)));
  Fixture() {
    std::memset(params, 0, kTotal * sizeof(float));
    set_file(0.0f);
  }
  ~Fixture() { std::free(params); }
  // The "update": p[i] = i + shift in the file, and (given a manager) in its resident chunks.
  void set_file(float shift, ChunkManager* m = nullptr) {
    const std::span<float> p = file.map(2);
    for (int64_t i = 0; i < kTotal; i++) p[size_t(i)] = float(i) + shift;
    if (m) m->refresh(0, kTotal, p.data());
  }
  // One step through `m`: each acquired unit holds the file's values.
  void step(ChunkManager& m, float shift) {
    m.begin_step();
    for (const int u : kStep) {
      m.acquire(u);
      const FlatRange r = kUnits[size_t(u)];
      for (int64_t i = r.offset; i < r.offset + r.count; i++)
        ASSERT_EQ(params[i], float(i) + shift) << "unit " << u << " at " << i;
      m.release(u);
    }
    m.end_step();
  }
};

// Unit-sized chunks (chunk_mb = 0) and no budget: the warm-up reads every unit at every use;
// replayed steps keep a unit whose next use is the next event (the head between forward and
// backward) and read one event ahead; nothing stays resident over the update, whose values
// the next step reads.
TEST(ChunkManager, WarmUpReadsEachUseAndReplayKeepsTheNextEvent) {
  Fixture f;
  ChunkManager m(f.file, f.params, kTotal, kUnits, 0, 0, nullptr);
  EXPECT_EQ(m.chunks(), 4);
  f.step(m, 0.0f);
  EXPECT_EQ(m.stats().reads, 8);
  EXPECT_EQ(m.stats().trace_events, 8);
  for (int c = 0; c < m.chunks(); c++) EXPECT_EQ(m.tier(c), ChunkManager::Tier::kDisk);
  f.set_file(0.5f, &m);
  f.step(m, 0.5f);
  EXPECT_EQ(m.stats().reads, 8 + 7);
  f.step(m, 0.5f);
  EXPECT_EQ(m.stats().reads, 8 + 7 + 7);
}

// Chunks of 1,024 floats cut across units; states follow acquire / release.
TEST(ChunkManager, FixedSizeChunksFollowTheirUnitsStates) {
  Fixture f;
  ChunkManager m(f.file, f.params, kTotal, kUnits, 1024, int64_t(1) << 30, nullptr);
  EXPECT_EQ(m.chunks(), 6);
  f.step(m, 0.0f);  // warm-up
  m.begin_step();
  m.acquire(kEmbed);
  EXPECT_EQ(m.state(0), State::kInUse);
  EXPECT_EQ(m.tier(1), ChunkManager::Tier::kMemory);  // block 0 read ahead (reading or held)
  EXPECT_NE(m.state(1), State::kInUse);
  EXPECT_EQ(m.state(3), State::kFree);
  m.acquire(0);
  EXPECT_EQ(m.state(1), State::kInUse);
  EXPECT_EQ(m.state(2), State::kInUse);
  m.release(kEmbed);
  EXPECT_EQ(m.state(0), State::kHeld);  // the budget keeps it for backward
  EXPECT_EQ(m.tier(0), ChunkManager::Tier::kMemory);
  m.release(0);
  m.drop_all();
  for (int c = 0; c < m.chunks(); c++) EXPECT_EQ(m.state(c), State::kFree);
}

// A budget of 20,480 bytes holds blocks 0 and 1 and one of the 4,096-byte end units. Replayed,
// forward reads every unit once; reading the head ahead evicts the embedding (next used
// last, furthest of the held units: Belady); backward finds the head and both blocks resident
// and reads the embedding again: 5 reads per step against 7 without a budget, and the chunk
// bytes resident never exceed the budget.
TEST(ChunkManager, BudgetEvictsFurthestNextUseFirst) {
  Fixture f;
  ChunkManager m(f.file, f.params, kTotal, kUnits, 0, with_slack(20480), nullptr);
  f.step(m, 0.0f);
  const int64_t warm = m.stats().reads, warm_evictions = m.stats().evictions;
  EXPECT_EQ(warm_evictions, 8);  // the warm-up drops every unit at its release
  f.step(m, 0.0f);
  EXPECT_EQ(m.stats().reads - warm, 5);
  EXPECT_EQ(m.stats().evictions - warm_evictions, 2);  // the embedding, then a block for its second read
  EXPECT_LE(m.stats().peak_resident_bytes, 20480);
  EXPECT_EQ(m.stats().over_budget_events, 0);
  // The whole model fits a larger budget: each chunk read once per step.
  ChunkManager all(f.file, f.params, kTotal, kUnits, 1024, with_slack(kTotal * 4), nullptr);
  f.step(all, 0.0f);
  const int64_t warm_all = all.stats().reads;
  f.step(all, 0.0f);
  EXPECT_EQ(all.stats().reads - warm_all, 6);
  EXPECT_EQ(all.stats().read_bytes - warm_all * 4096, kTotal * 4);
  // ...and kept through the update, which copies its values into them: no reads after.
  f.set_file(0.25f, &all);
  f.step(all, 0.25f);
  EXPECT_EQ(all.stats().reads - warm_all, 6);
}

// The warm-up measures what the rank holds besides parameters (a 16 KiB activation
// buffer), and the allowance is the budget less it: with 16 KiB + 12,288 bytes the
// chunks resident stay within 12,288 bytes (three 1,024-float chunks) and the run still
// sees the right values.
TEST(ChunkManager, AllowanceIsTheBudgetLessTheMeasuredNonModelMemory) {
  Fixture f;
  MemoryTracker tracker;
  std::vector<float> acts_storage(4096 + 1024);
  float* acts = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(acts_storage.data()) + 4095) & ~uintptr_t(4095));
  std::memset(acts, 1, 4096 * sizeof(float));
  tracker.track(tracker.category("params"), f.params, kTotal * 4);
  tracker.track(tracker.category("activations"), acts, 4096 * 4);
  ChunkManager m(f.file, f.params, kTotal, kUnits, 1024, with_slack(16384 + 12288), &tracker);
  f.step(m, 0.0f);
  EXPECT_EQ(m.stats().peak_non_model_bytes, 16384);
  const int64_t warm = m.stats().reads;
  f.step(m, 0.0f);
  EXPECT_LE(m.stats().peak_resident_bytes, 12288);
  EXPECT_GT(m.stats().reads - warm, 6);  // not everything fits: some chunks are read twice
  EXPECT_LT(m.stats().reads - warm, 12);  // fewer than the warm-up's every-use reads
}

// Note [Gradient chunks]: three 1 MiB gradient chunks under units that cut across them.
// A chunk never written reads as zero and is stored nowhere; without a budget a released
// chunk is spilled to the file and read back when its unit writes again; the norm pass sums
// the same pieces in the same order as sum_squares over the whole buffer (the same double);
// the update takes the chunks sub-group by sub-group and the step's end leaves none.
TEST(ChunkManager, GradientChunksSpillReadBackAndSumLikeTheWholeBuffer) {
  constexpr int64_t n = 3 * kNormPiece;
  const std::vector<FlatRange> units = {{100000, 300000}, {400000, 300000}, {0, 100000}, {700000, n - 700000}};
  TempDir dir("loom-chunks");
  StateFile file(dir.path.string(), 0, n, 65536, 2, false, 3, true);
  std::vector<float> params(static_cast<size_t>(n)), grads(static_cast<size_t>(n), 7.0f),
      expect(static_cast<size_t>(n), 0.0f);
  ChunkManager m(file, params.data(), n, units, kNormPiece, 0, nullptr, grads.data());
  ASSERT_EQ(m.chunks(ChunkManager::kGrads), 3);
  const Kernels& k = kernels(KernelBackend::kCpu);
  for (int step = 0; step < 2; step++) {
    m.begin_step();
    for (int c = 0; c < 3; c++) EXPECT_EQ(m.tier(c, ChunkManager::kGrads), ChunkManager::Tier::kNone);
    for (const int u : {3, 1, 0, 2, 1}) {  // block 1 twice: its second pass adds to what was spilled
      m.acquire_grads(u);
      const FlatRange r = units[size_t(u)];
      for (int64_t i = r.offset; i < r.offset + r.count; i++) {
        ASSERT_EQ(grads[size_t(i)], expect[size_t(i)]) << "step " << step << " unit " << u << " at " << i;
        grads[size_t(i)] += float(i % 13) + 0.5f;
        expect[size_t(i)] = grads[size_t(i)];
      }
      m.release_grads(u);
      if (step == 0)  // the warm-up keeps nothing (later steps keep what the next access needs)
        EXPECT_EQ(m.tier(int(r.offset / kNormPiece), ChunkManager::kGrads), ChunkManager::Tier::kDisk);
    }
    m.begin_update();
    const std::vector<FlatRange> ranges = {{5, 400000}, {500000, n - 500001}};
    EXPECT_EQ(m.grad_sum_squares(k, ranges), sum_squares(k, expect.data(), ranges));
    for (int64_t at = 0; at < n; at += 100000) {
      m.grads_for_update(at, std::min<int64_t>(100000, n - at));
      for (int64_t i = at; i < std::min(n, at + 100000); i++) ASSERT_EQ(grads[size_t(i)], expect[size_t(i)]);
    }
    m.end_step();
    for (int c = 0; c < 3; c++) EXPECT_EQ(m.tier(c, ChunkManager::kGrads), ChunkManager::Tier::kNone);
    std::fill(expect.begin(), expect.end(), 0.0f);
  }
  EXPECT_GT(m.stats().grad_written_bytes, 0);
  EXPECT_GT(m.stats().grad_read_bytes, 0);
}

}  // namespace
}  // namespace loom
