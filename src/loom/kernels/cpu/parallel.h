// Deterministic OpenMP helpers: work is split into a fixed number of contiguous chunks
// (one per thread of the current team size), and reductions combine per-chunk partials
// in chunk order. Same thread count => bit-identical results.
#pragma once
#include <omp.h>

#include <cstdint>
#include <vector>

#include "loom/core/even_split.h"
#include "loom/core/memory.h"

namespace loom::cpu {

inline int team_size() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

// [begin, end) of chunk `i` of `parts` over n items (core/even_split.h).
inline void chunk_range(int64_t n, int parts, int i, int64_t& begin, int64_t& end) {
  const EvenChunk c = even_chunk(n, parts, i);
  begin = c.begin, end = c.begin + c.count;
}

// Scratch that lives for the thread's lifetime; grows, never shrinks (on huge pages where
// the kernel gives them: Note [Huge pages] in core/memory.h).
inline float* scratch_floats(size_t count, int slot = 0) {
  thread_local std::vector<float> buf[4];
  if (buf[slot].size() < count) huge_resize(buf[slot], count);
  return buf[slot].data();
}

// The same for bf16 (uint16_t) operands.
inline uint16_t* scratch_bf16(size_t count, int slot = 0) {
  thread_local std::vector<uint16_t> buf[4];
  if (buf[slot].size() < count) huge_resize(buf[slot], count);
  return buf[slot].data();
}

}  // namespace loom::cpu
