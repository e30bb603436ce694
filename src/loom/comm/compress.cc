// Note [Compressed all-reduce] (algorithms.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/comm/algorithms.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

constexpr int kTagCompressed = kFirstInternalTag + 9;

}  // namespace

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

void compressed_ring_all_reduce(Link& l, std::span<std::byte> buf, size_t count, ReduceOp op, Compression c) {
  const int n = l.size(), r = l.rank();
  if (n == 1) return;
  float* data = reinterpret_cast<float*>(buf.data());
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  const size_t max_chunk = chunk_of(count, n, 0).count;
  const size_t wire = (compressed_bytes(c, max_chunk) + 63) / 64 * 64;  // keeps scales and floats aligned
  // Scratch: outgoing wire | incoming wire | one decompressed chunk.
  const std::span<std::byte> s = l.scratch(2 * wire + max_chunk * 4);
  std::byte* out_wire = s.data();
  std::byte* in_wire = s.data() + wire;
  float* tmp = reinterpret_cast<float*>(s.data() + 2 * wire);
  for (int st = 0; st < n - 1; ++st) {
    const Chunk send = chunk_of(count, n, mod(r - st, n)), recv = chunk_of(count, n, mod(r - st - 1, n));
    compress(c, data + send.begin, send.count, out_wire);
    l.exchange({out_wire, compressed_bytes(c, send.count)}, right, {in_wire, compressed_bytes(c, recv.count)}, left,
               kTagCompressed);
    decompress(c, in_wire, recv.count, tmp);
    float* acc = data + recv.begin;
    for (size_t i = 0; i < recv.count; ++i) acc[i] += tmp[i];
  }
  // Own chunk is complete: scale, quantise once, keep the dequantised value too.
  const Chunk own = chunk_of(count, n, mod(r + 1, n));
  if (op == ReduceOp::kAvg) divide(DType::kF32, reinterpret_cast<std::byte*>(data + own.begin), own.count, n);
  compress(c, data + own.begin, own.count, out_wire);
  decompress(c, out_wire, own.count, data + own.begin);
  for (int st = 0; st < n - 1; ++st) {
    const Chunk send = chunk_of(count, n, mod(r + 1 - st, n)), recv = chunk_of(count, n, mod(r - st, n));
    l.exchange({out_wire, compressed_bytes(c, send.count)}, right, {in_wire, compressed_bytes(c, recv.count)}, left,
               kTagCompressed);
    decompress(c, in_wire, recv.count, data + recv.begin);
    std::swap(out_wire, in_wire);  // forward the received bytes unchanged
  }
}

}  // namespace loom::comm
