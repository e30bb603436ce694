// Note [Context-parallel chunks] (cp_chunks.h).
#include "loom/rank/cp_chunks.h"

#include "loom/core/error.h"

namespace loom::rank {

std::vector<int32_t> cp_positions(int64_t T, int cp, int rank, CpSplit split) {
  LOOM_CHECK(cp >= 1 && rank >= 0 && rank < cp, "context-parallel rank ", rank, " of ", cp);
  const int64_t pieces = cp_pieces(cp, split);
  if (T % pieces != 0)
    throw ConfigError(detail::cat("a sequence of ", T, " tokens does not split into ", pieces, " equal chunks for parallel.cp = ",
                                  cp, split == CpSplit::kZigZag ? " (zigzag: 2 cp chunks)" : "", "; use a sequence length that is a multiple of ",
                                  pieces));
  const int64_t c = T / pieces;
  std::vector<int32_t> out;
  auto take = [&](int64_t chunk) {
    for (int64_t j = chunk * c; j < (chunk + 1) * c; ++j) out.push_back(int32_t(j));
  };
  take(rank);
  if (split == CpSplit::kZigZag) take(2 * int64_t(cp) - 1 - rank);
  return out;
}

std::vector<CpSlot> cp_owners(int64_t T, int cp, CpSplit split) {
  std::vector<CpSlot> out(static_cast<size_t>(T));
  for (int r = 0; r < cp; ++r) {
    const std::vector<int32_t> pos = cp_positions(T, cp, r, split);
    for (size_t i = 0; i < pos.size(); ++i) out[size_t(pos[i])] = {r, int32_t(i)};
  }
  return out;
}

}  // namespace loom::rank
