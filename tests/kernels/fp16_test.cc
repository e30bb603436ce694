// fp16 storage (issue 14, core/fp16.h): loom's software rounding against the CPU's own
// F16C conversions (vcvtps2ph / vcvtph2ps), which implement IEEE 754 binary16 exactly.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "loom/core/fp16.h"

namespace loom {
namespace {

__attribute__((target("f16c"))) uint16_t hw_to_fp16(float x) {
  return uint16_t(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("f16c"))) float hw_from_fp16(uint16_t h) { return _cvtsh_ss(h); }

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

TEST(Fp16, RoundsLikeTheHardware) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C to compare against";
  // Every fp16 value converts back exactly (NaNs: both quiet, same payload).
  for (uint32_t h = 0; h < 0x10000u; h++) {
    ASSERT_TRUE(same_bits(from_fp16(uint16_t(h)), hw_from_fp16(uint16_t(h)))) << std::hex << h;
    if (!std::isnan(from_fp16(uint16_t(h)))) {
      ASSERT_EQ(to_fp16(from_fp16(uint16_t(h))), h) << std::hex << h;
    }
  }
  // Edges: the largest finite value, the rounding threshold to infinity, the subnormals.
  for (float x : {65504.0f, 65519.99f, 65520.0f, 1e9f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f,
                  0x1.ffcp-15f, 0x1.ffep-15f, 1.0f + 0x1p-11f, 1.0f + 0x1.8p-10f, 0.0f, -0.0f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()}) {
    EXPECT_EQ(to_fp16(x), hw_to_fp16(x)) << x;
    EXPECT_EQ(to_fp16(-x), hw_to_fp16(-x)) << -x;
  }
  EXPECT_TRUE(std::isinf(round_fp16(65520.0f)));
  EXPECT_EQ(round_fp16(65519.99f), 65504.0f);
  EXPECT_EQ(round_fp16(0x1p-25f), 0.0f);          // halfway to the smallest subnormal: ties to even (0)
  EXPECT_EQ(round_fp16(0x1.8p-25f), 0x1p-24f);    // above halfway: up
  EXPECT_TRUE(std::isnan(round_fp16(std::bit_cast<float>(0x7f800001u))));  // a NaN whose top bits read inf
  // Random bit patterns over the whole float range, and values spread around fp16's range.
  const uint32_t seed = std::getenv("LOOM_TEST_SEED") ? uint32_t(std::stoul(std::getenv("LOOM_TEST_SEED")))
                                                      : std::random_device{}();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> expo(-30.0f, 18.0f);
  for (int i = 0; i < 2000000; i++) {
    const float x = i % 2 ? std::bit_cast<float>(uint32_t(rng())) : std::exp2(expo(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(round_fp16(x)));
      continue;
    }
    ASSERT_EQ(to_fp16(x), hw_to_fp16(x)) << std::hexfloat << x << " seed " << seed;
  }
}

}  // namespace
}  // namespace loom
