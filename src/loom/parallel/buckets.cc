#include "loom/parallel/buckets.h"

#include "loom/core/error.h"

namespace loom::parallel {

std::vector<Bucket> assign_buckets(const std::vector<TensorExtent>& tensors, const BucketCaps& caps) {
  LOOM_CHECK(caps.elem_bytes > 0, "bucket caps: element size must be > 0, got ", caps.elem_bytes);
  LOOM_CHECK(caps.first_cap_bytes >= caps.elem_bytes && caps.cap_bytes >= caps.elem_bytes,
             "bucket caps: first cap ", caps.first_cap_bytes, " B and cap ", caps.cap_bytes,
             " B must each hold at least one element of ", caps.elem_bytes, " B");
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOOM_CHECK(tensors[i].numel >= 0 && tensors[i].offset >= 0, "tensor ", i, " has offset ", tensors[i].offset,
               " and numel ", tensors[i].numel);
    LOOM_CHECK(i == 0 || tensors[i].offset >= tensors[i - 1].offset + tensors[i - 1].numel, "tensor ", i,
               " at offset ", tensors[i].offset, " overlaps or precedes tensor ", i - 1);
  }
  // Tensor i's range starts where tensor i - 1 ends (padding belongs to the tensor after
  // it), so consecutive buckets tile [tensors[0].offset, last end) without gaps.
  auto start_of = [&](int i) { return i == 0 ? tensors[0].offset : tensors[i - 1].offset + tensors[i - 1].numel; };
  std::vector<Bucket> out;
  int hi = static_cast<int>(tensors.size()) - 1;  // highest tensor not yet in a bucket
  while (hi >= 0) {
    const int64_t cap = (out.empty() ? caps.first_cap_bytes : caps.cap_bytes) / caps.elem_bytes;
    const int64_t end = tensors[hi].offset + tensors[hi].numel;
    int lo = hi;
    while (lo > 0 && end - start_of(lo - 1) <= cap) --lo;
    out.push_back({start_of(lo), end - start_of(lo), lo, hi});
    hi = lo - 1;
  }
  return out;
}

}  // namespace loom::parallel
