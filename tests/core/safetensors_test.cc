#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/bf16.h"
#include "loom/core/safetensors.h"

namespace loom {
namespace {

TEST(Safetensors, RoundTripAndHeaderAlignment) {
  const std::string path = ::testing::TempDir() + "/rt.safetensors";
  StFile f;
  f.metadata["k"] = "v";
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<int32_t> b = {1, 2, 3};
  f.tensors["a"] = make_f32({2, 3}, a.data());
  f.tensors["b"] = make_i32({3}, b.data());
  write_safetensors(path, f);
  const std::string bytes = read_file_bytes(path);
  uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  EXPECT_EQ((8 + hlen) % 8, 0u);
  StFile g = read_safetensors(path);
  EXPECT_EQ(g.metadata.at("k"), "v");
  EXPECT_EQ(g.at("a", path).shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(g.at("a", path).as_f32(), a);
  EXPECT_EQ(g.at("b", path).as_i32(), b);
  EXPECT_THROW(g.at("a", path).as_i32(), Error);
  EXPECT_THROW(g.at("zz", path), Error);
}

// BF16 tensors (loom export --dtype bf16, and most HF checkpoints): written rounded to
// nearest-even, read back widened exactly.
TEST(Safetensors, Bf16TensorsRoundTripRounded) {
  const std::string path = testing::TempDir() + "/bf16.safetensors";
  std::vector<float> v = {1.0f, 1.0f + 0x1p-8f, -3.140625f, 1e-3f, 65504.0f, -0.0f};
  StFile f;
  f.tensors["w"] = make_bf16({2, 3}, v.data());
  write_safetensors(path, f);
  const StFile back = read_safetensors(path);
  const StTensor& t = back.at("w", path);
  EXPECT_EQ(t.dtype, DType::kBF16);
  EXPECT_EQ(t.bytes.size(), 12u);
  const std::vector<float> got = t.as_f32();
  for (size_t i = 0; i < v.size(); i++) EXPECT_EQ(got[i], round_bf16(v[i])) << i;
  EXPECT_EQ(got[1], 1.0f);  // the tie rounds to even
}

TEST(Safetensors, DamagedFilesAreRefusedWithTheReason) {
  const std::string path = ::testing::TempDir() + "/dmg.safetensors";
  StFile f;
  std::vector<float> a(100, 1.0f);
  f.tensors["a"] = make_f32({100}, a.data());
  write_safetensors(path, f);
  const std::string good = read_file_bytes(path);
  auto expect_error = [&](const std::string& bytes, const std::string& needle) {
    std::ofstream(path, std::ios::binary) << bytes;
    try {
      read_safetensors(path);
      ADD_FAILURE() << "accepted a damaged file; expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(good.substr(0, good.size() - 4), "outside");     // truncated data
  expect_error(good.substr(0, 5), "shorter than the 8-byte");   // truncated header length
  std::string huge = good;
  huge[7] = char(0x7f);
  expect_error(huge, "exceeds the file size");
  std::string garbage = good;
  garbage[8] = '#';
  expect_error(garbage, "not valid JSON");
  EXPECT_THROW(read_safetensors("/no/such/file.safetensors"), Error);
}

}  // namespace
}  // namespace loom
