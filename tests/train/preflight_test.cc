// Note [Preflight]: what a rank runs (its build and its config) as two CRC-32s, and the
// refusal a gathered table gives.
#include <gtest/gtest.h>

#include "loom/core/config.h"
#include "loom/train/preflight.h"

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

}  // namespace
}  // namespace loom
