#include "loom/model/tp_slice.h"

#include <algorithm>
#include <cstring>

#include "loom/core/error.h"

namespace loom {

namespace {

// Calls run(whole_offset, local_offset, count) for every contiguous run of the slice;
// whole_offset < 0 marks local padding (vocabulary rows past the real vocabulary).
template <typename Fn>
void for_each_run(const ParamSpec& spec, const std::vector<int64_t>& whole_shape, int tp, int tp_rank, Fn run) {
  if (spec.vocab_parts > 0) tp = spec.vocab_parts, tp_rank = spec.vocab_index;  // pp_vocab's rows
  if (spec.split_dim < 0) {
    run(int64_t{0}, int64_t{0}, spec.numel);
    return;
  }
  const int64_t rows = whole_shape[0];
  if (spec.split_dim == 0) {
    // Rows: local row G_k-relative i of segment k is global row G_k + tp_rank * S_k/tp + i.
    int64_t inner = 1;
    for (size_t d = 1; d < whole_shape.size(); d++) inner *= whole_shape[d];
    int64_t g0 = 0, l0 = 0;
    for (int64_t seg : spec.segments) {
      const int64_t part = seg / tp;
      for (int64_t i = 0; i < part; i++) {
        const int64_t gr = g0 + tp_rank * part + i;
        run(gr < rows ? gr * inner : int64_t{-1}, (l0 + i) * inner, inner);
      }
      g0 += seg, l0 += part;
    }
    return;
  }
  LOOM_ASSERT(spec.split_dim == 1 && whole_shape.size() == 2);
  const int64_t cols = whole_shape[1], local_cols = spec.shape[1];
  for (int64_t r = 0; r < rows; r++) {
    int64_t g0 = 0, l0 = 0;
    for (int64_t seg : spec.segments) {
      const int64_t part = seg / tp;
      run(r * cols + g0 + tp_rank * part, r * local_cols + l0, part);
      g0 += seg, l0 += part;
    }
  }
}

}  // namespace

void slice_to_local(const ParamSpec& spec, const std::vector<int64_t>& whole_shape, const float* whole, float* local,
                    int tp, int tp_rank) {
  for_each_run(spec, whole_shape, tp, tp_rank, [&](int64_t w, int64_t l, int64_t n) {
    if (w < 0) std::fill(local + l, local + l + n, 0.0f);
    else std::memcpy(local + l, whole + w, size_t(n) * sizeof(float));
  });
}

void local_to_whole(const ParamSpec& spec, const std::vector<int64_t>& whole_shape, const float* local, float* whole,
                    int tp, int tp_rank) {
  for_each_run(spec, whole_shape, tp, tp_rank, [&](int64_t w, int64_t l, int64_t n) {
    if (w >= 0) std::memcpy(whole + w, local + l, size_t(n) * sizeof(float));
  });
}

}  // namespace loom
