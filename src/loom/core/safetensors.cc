#include "loom/core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/bf16.h"

namespace loom {

namespace {
size_t dtype_size(DType d) { return d == DType::kBF16 ? 2 : 4; }
const char* dtype_name(DType d) { return d == DType::kF32 ? "F32" : d == DType::kI32 ? "I32" : "BF16"; }
}  // namespace

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> StTensor::as_f32() const {
  LOOM_CHECK(dtype != DType::kI32, "tensor has dtype I32, expected F32 or BF16");
  std::vector<float> out(numel());
  if (dtype == DType::kF32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  for (size_t i = 0; i < out.size(); i++) {
    bf16 h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = from_bf16(h);
  }
  return out;
}

std::vector<int32_t> StTensor::as_i32() const {
  LOOM_CHECK(dtype == DType::kI32, "tensor has dtype ", dtype_name(dtype), ", expected I32");
  std::vector<int32_t> out(numel());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

const StTensor& StFile::at(const std::string& name, const std::string& path) const {
  auto it = tensors.find(name);
  LOOM_CHECK(it != tensors.end(), "safetensors file '", path, "' has no tensor '", name, "'");
  return it->second;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); i++) {
    if (i) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + ")";
}

StTensor make_f32(std::vector<int64_t> shape, const float* data) {
  StTensor t;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.bytes.resize(size_t(t.numel()) * 4);
  std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

StTensor make_bf16(std::vector<int64_t> shape, const float* data) {
  StTensor t;
  t.dtype = DType::kBF16;
  t.shape = std::move(shape);
  t.bytes.resize(size_t(t.numel()) * 2);
  for (int64_t i = 0; i < t.numel(); i++) {
    const bf16 h = to_bf16(data[i]);
    std::memcpy(t.bytes.data() + 2 * i, &h, 2);
  }
  return t;
}

StTensor make_i32(std::vector<int64_t> shape, const int32_t* data) {
  StTensor t;
  t.dtype = DType::kI32;
  t.shape = std::move(shape);
  t.bytes.resize(size_t(t.numel()) * 4);
  std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

StFile read_safetensors(const std::string& path) { return parse_safetensors(read_file_bytes(path), path); }

StFile parse_safetensors(std::string_view data, const std::string& path) {
  auto fail = [&](const std::string& why) -> Error {
    return Error("cannot read safetensors file '" + path + "': " + why);
  };
  if (data.size() < 8) throw fail("file is " + std::to_string(data.size()) + " bytes, shorter than the 8-byte header length");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | uint8_t(data[i]);
  if (hlen > data.size() - 8)
    throw fail("header length " + std::to_string(hlen) + " exceeds the file size " + std::to_string(data.size()));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data.begin() + 8, data.begin() + 8 + int64_t(hlen));
  } catch (const std::exception& e) {
    throw fail(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  const size_t data_begin = 8 + hlen, data_size = data.size() - data_begin;
  StFile out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw fail("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw fail("__metadata__ value for '" + k + "' is not a string");
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      throw fail("tensor '" + name + "' lacks dtype, shape or data_offsets");
    StTensor t;
    const auto& dt = entry["dtype"];
    if (!dt.is_string()) throw fail("tensor '" + name + "' dtype is not a string");
    const std::string dts = dt.get<std::string>();
    if (dts == "F32") t.dtype = DType::kF32;
    else if (dts == "I32") t.dtype = DType::kI32;
    else if (dts == "BF16") t.dtype = DType::kBF16;
    else throw fail("tensor '" + name + "' has dtype " + dts + "; loom reads F32, BF16 and I32 (convert with torch: t.float())");
    const auto& shape = entry["shape"];
    const auto& offs = entry["data_offsets"];
    if (!shape.is_array() || !offs.is_array() || offs.size() != 2)
      throw fail("tensor '" + name + "' has a malformed shape or data_offsets");
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40))
        throw fail("tensor '" + name + "' has a bad dimension " + d.dump());
      const uint64_t dim = d.get<uint64_t>();
      t.shape.push_back(int64_t(dim));
      if (dim != 0 && numel > ((uint64_t(1) << 40) / dim)) throw fail("tensor '" + name + "' is implausibly large");
      numel *= dim;
    }
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      throw fail("tensor '" + name + "' data_offsets are not unsigned integers");
    const uint64_t b = offs[0].get<uint64_t>(), e = offs[1].get<uint64_t>();
    if (b > e || e > data_size)
      throw fail("tensor '" + name + "' byte range [" + std::to_string(b) + ", " + std::to_string(e) +
                 ") lies outside the " + std::to_string(data_size) + "-byte data section (truncated file?)");
    if (e - b != numel * dtype_size(t.dtype))
      throw fail("tensor '" + name + "' byte range holds " + std::to_string(e - b) + " bytes, shape needs " +
                 std::to_string(numel * dtype_size(t.dtype)));
    t.bytes.assign(data.begin() + int64_t(data_begin + b), data.begin() + int64_t(data_begin + e));
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

void write_safetensors(const std::string& path, const StFile& file) {
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t off = 0;
  for (const auto& [name, t] : file.tensors) {
    header[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  std::string blob(8, '\0');
  const uint64_t hlen = h.size();
  for (int i = 0; i < 8; i++) blob[i] = char((hlen >> (8 * i)) & 0xff);
  blob += h;
  blob.reserve(blob.size() + off);
  for (const auto& [name, t] : file.tensors) blob.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  write_file_atomic(path, blob);
}

}  // namespace loom
