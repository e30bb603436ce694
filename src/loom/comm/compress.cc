// Note [Compressed all-reduce] (algorithms.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/comm/algorithms.h"
#include "loom/core/error.h"

namespace loom::comm {

size_t compressed_bytes(Compression c, size_t count) {
  switch (c) {
    case Compression::kNone: return count * 4;
    case Compression::kBF16: return count * 2;
    case Compression::kInt8: return (count + kQuantBlock - 1) / kQuantBlock * 4 + count;  // scales, then values
  }
  return 0;
}

void compress(Compression c, const float* x, size_t count, std::byte* out) {
  if (c == Compression::kBF16) {
    bf16* o = reinterpret_cast<bf16*>(out);
    for (size_t i = 0; i < count; ++i) o[i] = float_to_bf16(x[i]);
    return;
  }
  LOOM_ASSERT(c == Compression::kInt8, "compress called with ", compression_name(c));
  const size_t blocks = (count + kQuantBlock - 1) / kQuantBlock;
  float* scales = reinterpret_cast<float*>(out);
  int8_t* q = reinterpret_cast<int8_t*>(out + blocks * 4);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * kQuantBlock, hi = std::min(count, lo + kQuantBlock);
    float amax = 0;
    for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax > 0 ? amax / 127.f : 1.f;
    const float inv = 1.f / scale;
    std::memcpy(&scales[b], &scale, 4);
    // |x * inv| <= 127 by construction; nearbyint rounds half to even like lrint, inlined.
    for (size_t i = lo; i < hi; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * inv));
  }
}

void decompress(Compression c, const std::byte* in, size_t count, float* x) {
  if (c == Compression::kBF16) {
    const bf16* v = reinterpret_cast<const bf16*>(in);
    for (size_t i = 0; i < count; ++i) x[i] = bf16_to_float(v[i]);
    return;
  }
  const size_t blocks = (count + kQuantBlock - 1) / kQuantBlock;
  const int8_t* q = reinterpret_cast<const int8_t*>(in + blocks * 4);
  for (size_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, in + b * 4, 4);
    const size_t lo = b * kQuantBlock, hi = std::min(count, lo + kQuantBlock);
    for (size_t i = lo; i < hi; ++i) x[i] = scale * q[i];
  }
}

namespace {

class CompressionCodec : public RingCodec {
 public:
  explicit CompressionCodec(Compression c) : c_(c) {}
  size_t wire_bytes(size_t count) const override { return compressed_bytes(c_, count); }
  void encode(const float* x, size_t count, std::byte* wire) const override { compress(c_, x, count, wire); }
  void decode(const std::byte* wire, size_t count, float* x) const override { decompress(c_, wire, count, x); }

 private:
  Compression c_;
};

}  // namespace

const RingCodec& ring_codec(Compression c) {
  static const CompressionCodec bf16(Compression::kBF16), int8(Compression::kInt8);
  LOOM_ASSERT(c != Compression::kNone, "no ring codec for uncompressed messages");
  return c == Compression::kBF16 ? bf16 : int8;
}

}  // namespace loom::comm
