// Note [Survivors]: which ranks gone without an exit code failed on their own account.
#include "loom/core/survivors.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

using std::chrono::milliseconds;
using T = Survivors::Clock::time_point;

std::vector<char> faulty(const Survivors& s) { return s.faulty(); }

TEST(Survivors, ARemoteRankGoneFailed) {
  Survivors s(2);
  const T t0{};
  s.gone(1, false, t0);
  s.judge(t0);
  EXPECT_EQ(faulty(s), (std::vector<char>{0, 1}));
}

TEST(Survivors, ALocalRankAloneFailsOnceItsWindowHasPassed) {
  Survivors s(2);
  const T t0{};
  s.gone(0, true, t0);
  s.judge(t0 + milliseconds(100));
  EXPECT_EQ(faulty(s), (std::vector<char>{0, 0})) << "judged before its window passed";
  s.judge(t0 + Survivors::kSurvivorWindow + milliseconds(1));
  EXPECT_EQ(faulty(s), (std::vector<char>{1, 0}));
}

TEST(Survivors, ALocalRankWithARemoteLossInTheSamePollIsASurvivor) {
  Survivors s(2);
  const T t0{};
  s.gone(0, true, t0);
  s.gone(1, false, t0);
  s.judge(t0);
  s.finish();
  EXPECT_EQ(faulty(s), (std::vector<char>{0, 1}));
}

// The loaded-suite failure of check_hosts.py `both`: the local rank's end seen a poll before
// the remote rank's closed connection.
TEST(Survivors, ALocalRankWithARemoteLossSeenAPollLaterIsASurvivor) {
  Survivors s(2);
  const T t0{};
  s.gone(0, true, t0);
  s.judge(t0);
  s.gone(1, false, t0 + milliseconds(150));
  s.judge(t0 + milliseconds(150));
  s.finish();
  EXPECT_EQ(faulty(s), (std::vector<char>{0, 1}));
}

// check_elastic_hosts.py `all-lost`: the local rank killed first, the other hosts lost later.
TEST(Survivors, ALocalRankWithARemoteLossAfterItsWindowFailed) {
  Survivors s(4);
  const T t0{};
  s.gone(0, true, t0);
  for (int ms = 50; ms <= 1500; ms += 50) s.judge(t0 + milliseconds(ms));
  for (int r = 1; r < 4; ++r) s.gone(r, false, t0 + milliseconds(1500));
  s.judge(t0 + milliseconds(1500));
  EXPECT_EQ(faulty(s), (std::vector<char>{1, 1, 1, 1}));
}

TEST(Survivors, ALocalRankStillWaitingWhenTheJobEndsFailed) {
  Survivors s(3);
  const T t0{};
  s.gone(2, true, t0);
  s.judge(t0);
  s.finish();
  EXPECT_EQ(faulty(s), (std::vector<char>{0, 0, 1}));
}

TEST(Survivors, ARemoteLossBeforeTheLocalOneDoesNotSpareIt) {
  // (A local rank gone after a failure seen in an earlier poll is a survivor the caller never
  // passes.) A remote loss before the local rank was seen does not spare it.
  Survivors s(2);
  const T t0{};
  s.gone(1, false, t0);
  s.judge(t0);
  s.gone(0, true, t0 + milliseconds(600));
  s.finish();
  EXPECT_EQ(faulty(s), (std::vector<char>{1, 1}));
}

}  // namespace
}  // namespace loom
