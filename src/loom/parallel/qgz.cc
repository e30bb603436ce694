// Note [qgZ] (qgz.h).
#include "loom/parallel/qgz.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/comm/algorithms.h"
#include "loom/core/error.h"

namespace loom::parallel {

namespace {

// The int8 codec of one piece; a non-finite piece gets NaN scales (and zero codes, so
// nothing undefined is cast), which decode to NaN everywhere in it.
void encode(const float* x, size_t n, uint8_t* out) {
  auto* wire = reinterpret_cast<std::byte*>(out);
  if (std::all_of(x, x + n, [](float v) { return std::isfinite(v); })) {
    comm::compress(comm::Compression::kInt8, x, n, wire);
    return;
  }
  const size_t blocks = (n + comm::kQuantBlock - 1) / comm::kQuantBlock;
  const float nan = NAN;
  for (size_t b = 0; b < blocks; b++) std::memcpy(out + 4 * b, &nan, 4);
  std::fill(out + 4 * blocks, out + 4 * blocks + n, uint8_t{0});
}

}  // namespace

double QgzScatter::wire_bytes(int64_t count, int64_t dp) {
  return double(comm::compressed_bytes(comm::Compression::kInt8, size_t(count / dp))) * double(dp - 1);
}

QgzScatter::QgzScatter(comm::Group& dp, std::span<const float> all)
    : dp_(dp.size()), me_(dp.group_rank()), piece_(all.size() / size_t(dp_)),
      wire_(comm::compressed_bytes(comm::Compression::kInt8, piece_)) {
  LOOM_ASSERT(all.size() % size_t(dp_) == 0);
  send_.assign(wire_ * size_t(dp_), 0);
  recv_.assign(wire_ * size_t(dp_), 0);
  for (int j = 0; j < dp_; j++)
    if (j != me_) encode(all.data() + size_t(j) * piece_, piece_, send_.data() + size_t(j) * wire_);
  work_ = dp.all_to_all(std::span<const uint8_t>(send_), std::span<uint8_t>(recv_), {.async = true});
}

void QgzScatter::complete(std::span<float> own, float scale) {
  if (done_) return;
  LOOM_ASSERT(own.size() == piece_);
  std::vector<float> piece(piece_);
  for (int r = 0; r < dp_; r++) {
    if (r == me_) continue;
    comm::decompress(comm::Compression::kInt8, reinterpret_cast<const std::byte*>(recv_.data()) + size_t(r) * wire_,
                     piece_, piece.data());
    for (size_t i = 0; i < piece_; i++) own[i] += piece[i];
  }
  if (scale != 1.0f)
    for (float& x : own) x *= scale;
  done_ = true;
  send_ = {}, recv_ = {};
}

}  // namespace loom::parallel
