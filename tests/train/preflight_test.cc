// Note [Preflight]: what a rank runs (its build and its config) as two CRC-32s, and the
// refusal a gathered table gives.
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/ckpt/run_dir.h"
#include "loom/comm/world.h"
#include "loom/core/config.h"
#include "loom/train/preflight.h"
#include "loom/train/run_start.h"

namespace loom {
namespace {

TEST(Preflight, TheSameJobAgreesAndADifferenceNamesTheRankAndItsHost) {
  const Config a = load_config("", {"train.steps=2"}), b = load_config("", {"train.steps=3"});
  const RankIdentity ia = identity_of(a), ib = identity_of(b);
  EXPECT_EQ(ia.build, ib.build);  // one binary
  EXPECT_NE(ia.config, ib.config);
  EXPECT_EQ(identity_of(load_config("", {"train.steps=2"})).config, ia.config);
  // Debian's toolchain links with --build-id: loom's own build is named by it.
  EXPECT_EQ(build_id_hex().size() % 2, 0u);
  EXPECT_FALSE(build_id_hex().empty());
  EXPECT_EQ(preflight_problem({ia, ia, ia}, {"a", "a", "b"}), "");
  const std::string config = preflight_problem({ia, ia, ib}, {"a", "a", "b"});
  EXPECT_NE(config.find("rank 2 on host b was given another config"), std::string::npos) << config;
  EXPECT_EQ(config.find("rank 1"), std::string::npos) << config;
  RankIdentity other = ia;
  other.build ^= 1;
  const std::string build = preflight_problem({ia, other}, {"a", "b"});
  EXPECT_NE(build.find("rank 1 on host b runs another loom build"), std::string::npos) << build;
  EXPECT_NE(build.find("rank 0's"), std::string::npos) << build;
  EXPECT_NE(build.find("on host a"), std::string::npos) << build;
}

// Note [Shared checkpoint directory]: two ranks "on hosts a and b"; rank 0 holds the lock in
// its directory. Where rank 1 reads the same directory the check passes; where it reads one
// of its own (its host's disk), both ranks refuse, naming rank 1 and host b.
TEST(Preflight, ACheckpointDirectoryARankDoesNotSeeIsRefusedOnEveryRank) {
  namespace fs = std::filesystem;
  const std::string a = ::testing::TempDir() + "/preflight_a", b = ::testing::TempDir() + "/preflight_b";
  fs::remove_all(a), fs::remove_all(b), fs::create_directories(b);
  std::vector<std::string> said(2);
  for (const bool shared : {true, false}) {
    const auto errors = comm::run_threads(2, {}, [&](comm::World& w) {
      std::unique_ptr<DirLock> lock;
      if (w.global_rank() == 0) lock = std::make_unique<DirLock>(a);
      int64_t ready = 1;  // rank 0's lock is written before anyone reads it
      w.world_group().all_reduce(std::span<int64_t>(&ready, 1));
      check_shared_dir(w.global_rank() == 0 || shared ? a : b, w.world_group());
    }, {"a", "b"});
    if (shared) {
      EXPECT_EQ(errors, std::vector<std::string>(2));
      continue;
    }
    for (const std::string& e : errors) {
      EXPECT_NE(e.find("' is not one directory for every rank: rank 0 on host a holds its lock there and it is not "
                       "seen by rank 1 on host b"),
                std::string::npos)
          << e;
    }
  }
}

}  // namespace
}  // namespace loom
