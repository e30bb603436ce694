// Note [Start deadline]: a Deadline runs its expiry only when it is not met in time.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "loom/core/liveness.h"

namespace loom {
namespace {

TEST(Deadline, ExpiresOnceWhenNotMetAndNeverWhenMet) {
  std::atomic<int> expired{0};
  {
    liveness::Deadline d(0.05, [&] { ++expired; });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_EQ(expired.load(), 1);
  {
    liveness::Deadline d(0.2, [&] { ++expired; });  // met at once
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(expired.load(), 1);
}

}  // namespace
}  // namespace loom
