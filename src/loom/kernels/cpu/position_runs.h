// Runs of consecutive positions (a zig-zag or plain chunk of a context-parallel rank,
// rank/cp_chunks.h): the unit over which the context-parallel kernels run their GEMMs.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace loom::cpu {

// [start, end) index pairs over pos[0 .. n), each a run with pos[i + 1] = pos[i] + 1.
inline std::vector<std::pair<int64_t, int64_t>> position_runs(const int32_t* pos, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t t = 0; t < n;) {
    int64_t e = t + 1;
    while (e < n && pos[e] == pos[e - 1] + 1) e++;
    out.push_back({t, e});
    t = e;
  }
  return out;
}

}  // namespace loom::cpu
