// The safetensors container: 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then data.
// Reading validates every offset and size against the file before touching data, and
// never executes anything from the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

enum class DType { kF32, kI32, kBF16 };

struct StTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // raw little-endian data
  int64_t numel() const;
  std::vector<float> as_f32() const;    // F32, or BF16 widened exactly; throws for I32
  std::vector<int32_t> as_i32() const;
};

struct StFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, StTensor> tensors;
  const StTensor& at(const std::string& name, const std::string& path) const;
};

// Throws loom::Error naming the file and the problem (truncated, bad header, offsets).
StFile read_safetensors(const std::string& path);
// The same from bytes in memory; `path` only names them in errors.
StFile parse_safetensors(std::string_view data, const std::string& path);
// Writes `path` atomically: to `path.tmp`, fsync, rename.
void write_safetensors(const std::string& path, const StFile& file);

// "(2,3)" for error messages.
std::string shape_string(const std::vector<int64_t>& shape);

StTensor make_f32(std::vector<int64_t> shape, const float* data);
StTensor make_i32(std::vector<int64_t> shape, const int32_t* data);
// fp32 values rounded to nearest-even bf16 (Note [bf16 rounding points]).
StTensor make_bf16(std::vector<int64_t> shape, const float* data);

}  // namespace loom
