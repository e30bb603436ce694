// Note [Kernel profile]: a timed table computes what the plain one does and counts each call.
#include <gtest/gtest.h>

#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/kernels.h"
#include "loom/kernels/profile.h"

namespace loom {
namespace {

TEST(KernelProfile, TimedTableGivesTheSameResultsAndCountsTheCalls) {
  const Kernels& plain = kernels(KernelBackend::kRef);
  const Kernels timed = profiled_kernels(plain);
  EXPECT_NE(timed.sum_squares, plain.sum_squares);  // wrapped
  std::vector<float> x = {1, 2, 3, 4}, y = x;
  auto calls = [](const char* name) {
    for (const KernelTime& t : kernel_profile())
      if (t.name == name) return t.calls;
    return int64_t(0);
  };
  const int64_t before = calls("sum_squares");
  EXPECT_EQ(timed.sum_squares(x.data(), 4), plain.sum_squares(x.data(), 4));
  EXPECT_EQ(timed.sum_squares(x.data(), 4), 30.0);
  EXPECT_EQ(calls("sum_squares"), before + 2);
  timed.scale_inplace(x.data(), 4, 0.5f);
  plain.scale_inplace(y.data(), 4, 0.5f);
  EXPECT_EQ(x, y);
  EXPECT_GE(calls("scale_inplace"), 1);
  EXPECT_NE(kernel_profile_text().find("sum_squares"), std::string::npos);
  // Wrapping the same table again is fine; another table would redirect this one's calls.
  EXPECT_NO_THROW(profiled_kernels(plain));
  EXPECT_THROW(profiled_kernels(kernels(KernelBackend::kCpu)), Error);
}

}  // namespace
}  // namespace loom
