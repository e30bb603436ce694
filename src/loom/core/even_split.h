// One rule for cutting n items into contiguous near-equal chunks, shared by the collectives
// (buffer chunks of a ring) and the CPU kernels (rows per thread).
#pragma once

#include <cstdint>

namespace loom {

struct EvenChunk {
  int64_t begin = 0, count = 0;
};

// Chunk i of `parts` over n items, [begin, begin + count): the first n % parts chunks get
// one item more than the rest.
constexpr EvenChunk even_chunk(int64_t n, int64_t parts, int64_t i) {
  const int64_t base = n / parts, extra = n % parts;
  return {i * base + (i < extra ? i : extra), base + (i < extra ? 1 : 0)};
}

}  // namespace loom
