// Note [Optimizer offload]: the streamed moment file and AdamW over it.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <random>

#include "loom/core/error.h"
#include "loom/modes/offload/offload.h"
#include "loom/optim/optimizer.h"
#include "support/temp_dir.h"

namespace loom {
namespace {

using testing_support::TempDir;

// Every sub-group passes through in order, each exactly once per pass, with what the last
// pass left there (including the prefetched first groups, whose reads queue behind their
// writes), for sizes that do and do not divide the state, for 2 to 4 slots, through the
// page cache and with O_DIRECT (sub-groups rounded up to 1,024 floats, the last transfer
// padded to 4 KiB); map() sees the same bytes.
void streams_every_sub_group(bool direct) {
  TempDir dir("loom-offload");
  for (auto [state, group, slots] : std::vector<std::tuple<int64_t, int64_t, int>>{
           {1000, 97, 2}, {1000, 100, 3}, {10, 64, 3}, {4099, 1024, 4}, {7, 1, 2}, {5000, 1500, 3}}) {
    StateFile f(dir.path.string(), 0, state, group, slots, direct);
    std::vector<float> ref_m(size_t(state), 0.0f), ref_v(size_t(state), 0.0f);
    for (int pass = 0; pass < 3; pass++) {
      int64_t next = 0;
      f.for_each([&](int64_t begin, int64_t count, float* m, float* v, float*) {
        ASSERT_EQ(begin, next);
        for (int64_t i = 0; i < count; i++) {
          ASSERT_EQ(m[i], ref_m[size_t(begin + i)]) << "state " << state << " pass " << pass << " at " << begin + i;
          ASSERT_EQ(v[i], ref_v[size_t(begin + i)]);
          m[i] = ref_m[size_t(begin + i)] = float(pass * 10000 + begin + i);
          v[i] = ref_v[size_t(begin + i)] = -float(pass * 10000 + begin + i);
        }
        next = begin + count;
      });
      EXPECT_EQ(next, state);
    }
    const std::span<float> m = f.map(0), v = f.map(1);
    EXPECT_TRUE(std::equal(m.begin(), m.end(), ref_m.begin()));
    EXPECT_TRUE(std::equal(v.begin(), v.end(), ref_v.begin()));
    m[0] = 42.0f;  // a restore writes through the mapping; the next pass reads it
    f.for_each([&](int64_t begin, int64_t, float* mm, float*, float*) {
      if (begin == 0) EXPECT_EQ(mm[0], 42.0f);
    });
    if (!direct) EXPECT_EQ(f.bytes_written(), 4 * 2 * 4 * state);  // 4 passes, m and v, 4 bytes each
    else EXPECT_EQ(f.bytes_written() % 4096, 0);
  }
}

TEST(OptimizerOffload, StreamsEverySubGroupWithWhatTheLastPassLeft) { streams_every_sub_group(false); }

TEST(OptimizerOffload, StreamsEverySubGroupWithODirect) {
  TempDir probe("loom-offload");
  try {
    StateFile f(probe.path.string(), 0, 10, 10, 2, true);
  } catch (const Error& e) {  // tmpfs before Linux 6.6: the refusal names the setting
    ASSERT_NE(std::string(e.what()).find("does not support O_DIRECT (offload.direct = true)"), std::string::npos);
    GTEST_SKIP() << "the temp directory's file system has no O_DIRECT: " << e.what();
  }
  streams_every_sub_group(true);
}

TEST(OptimizerOffload, RefusesAMissingDirectoryNamingIt) {
  try {
    StateFile f("/nonexistent/offload", 0, 100, 10, 3);
    FAIL() << "accepted a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offload.dir '/nonexistent/offload': no such directory"), std::string::npos)
        << e.what();
  }
  try {  // /proc is a directory nobody, root included, can create files in
    StateFile f("/proc", 0, 100, 10, 3);
    FAIL() << "accepted /proc";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create a scratch file there"), std::string::npos) << e.what();
  }
}

// A disk too small for the file is refused before any step, naming the directory and the
// MiB needed: RLIMIT_FSIZE stands in for a full disk (posix_fallocate fails with EFBIG, as it
// would with ENOSPC).
TEST(OptimizerOffload, RefusesADiskTooSmallBeforeTheFirstStep) {
  TempDir dir("loom-offload");
  struct rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills the process
  struct rlimit small = old;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string what;
  try {
    StateFile f(dir.path.string(), 0, int64_t(4) << 20, 1 << 20, 3);  // 2 x 16 MiB of moments
  } catch (const Error& e) {
    what = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(what.find("cannot allocate 32 MiB for this rank's offloaded AdamW moments"), std::string::npos) << what;
  EXPECT_NE(what.find(dir.path.string()), std::string::npos) << what;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path)) << "the scratch file is unlinked even when refused";
}

// AdamW with its moments offloaded takes the same steps bit for bit as in memory: every
// weight-decay run cut at sub-group boundaries that fall inside runs, over a sharded
// `owned` (ZeRO's pieces) and the whole buffer.
TEST(OptimizerOffload, AdamWOverTheFileEqualsAdamWInMemory) {
  TempDir dir("loom-offload");
  ModelConfig mc;
  apply_model_preset(mc, "tiny");
  const ParamLayout layout(mc);
  const int64_t n = layout.total_floats();
  const Kernels& k = kernels(KernelBackend::kCpu);
  for (const std::vector<FlatRange>& owned : {std::vector<FlatRange>{}, {{3, n / 3}, {n / 2, n / 2 - 5}}}) {
    AdamW mem(layout, OptimConfig{}, owned), off(layout, OptimConfig{}, owned, true);
    off.offload(std::make_unique<StateFile>(dir.path.string(), 1, off.state_floats(), 1237, 3));
    std::mt19937 rng(7);
    std::normal_distribution<float> dist;
    std::vector<float> p(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (float& x : p) x = dist(rng);
    std::vector<float> q = p;
    for (int step = 0; step < 4; step++) {
      for (float& x : g) x = dist(rng);
      mem.step(k, p, g, 1e-2);
      off.step(k, q, g, 1e-2);
      ASSERT_EQ(p, q) << "step " << step;
    }
    const std::span<float> m = off.moment(0), v = off.moment(1);
    EXPECT_TRUE(std::equal(m.begin(), m.end(), mem.m().begin()));
    EXPECT_TRUE(std::equal(v.begin(), v.end(), mem.v().begin()));
    EXPECT_EQ(off.m().size(), 0u);  // nothing of the moments stays in memory
  }
}

}  // namespace
}  // namespace loom
