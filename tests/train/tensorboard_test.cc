// The TensorBoard writer's framing (Note [TensorBoard events]); the messages themselves are
// decoded by protobuf's reader in tests/reference/check_tensorboard.py.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"
#include "loom/train/tensorboard.h"
#include "support/temp_dir.h"

namespace loom {
namespace {

uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

TEST(TensorBoard, Crc32cHasItsCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC-32C catalogue's check value
  EXPECT_EQ(crc32c("", 0), 0u);
}

// Records framed as TensorFlow reads them: each length and body with its masked CRC-32C,
// the file a new one per writer (nothing replaced), and the scalar's float bytes inside.
TEST(TensorBoard, RecordsAreFramedWithMaskedChecksums) {
  testing_support::TempDir dir("loom-tb");
  std::string first, second;
  {
    TensorBoardWriter a(dir / "tb");
    a.scalars(3, {{"train/loss", 2.5}});
    first = a.path();
    TensorBoardWriter b(dir / "tb");
    second = b.path();
  }
  EXPECT_NE(first, second);
  std::ifstream f(first, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string data = ss.str();
  size_t at = 0;
  int records = 0;
  while (at < data.size()) {
    ASSERT_LE(at + 12, data.size());
    uint64_t n;
    uint32_t head, body;
    std::memcpy(&n, data.data() + at, 8);
    std::memcpy(&head, data.data() + at + 8, 4);
    EXPECT_EQ(head, masked(crc32c(data.data() + at, 8)));
    ASSERT_LE(at + 12 + n + 4, data.size());
    std::memcpy(&body, data.data() + at + 12 + n, 4);
    EXPECT_EQ(body, masked(crc32c(data.data() + at + 12, n)));
    if (records == 0) EXPECT_NE(data.substr(at + 12, n).find("brain.Event:2"), std::string::npos);
    if (records == 1) {
      const float v = 2.5f;
      EXPECT_NE(data.substr(at + 12, n).find(std::string(reinterpret_cast<const char*>(&v), 4)), std::string::npos);
      EXPECT_NE(data.substr(at + 12, n).find("train/loss"), std::string::npos);
    }
    at += 12 + n + 4;
    records++;
  }
  EXPECT_EQ(records, 2);
  std::ofstream(dir / "file") << "x";
  EXPECT_THROW(TensorBoardWriter(dir / "file"), Error);  // a file where the directory should be
}

}  // namespace
}  // namespace loom
