// Data-parallel gradient buckets: which ranges of the flat gradient buffer are
// all-reduced together, and in what order.
//
// Note [Bucket assignment]
// Backward produces gradients roughly in reverse layout order (last layer first), so
// buckets are formed walking the tensors from the last to the first: a bucket takes
// whole tensors until adding the next would pass its cap (first bucket: first_cap_bytes,
// small so communication starts early; the rest: cap_bytes); a tensor larger than the cap
// gets a bucket of its own. Each bucket is one contiguous (offset, count) range of the
// flat buffer (padding between tensors included, so ranges tile the tensors' span). The
// result is a pure function of (tensors, caps): every rank computes the same buckets and
// launches them strictly in index order (PyTorch DDP's reducer does the same).
#pragma once

#include <cstdint>
#include <vector>

namespace loom::parallel {

struct TensorExtent {
  int64_t offset = 0;  // in elements, into the flat buffer
  int64_t numel = 0;
};

struct Bucket {
  int64_t offset = 0, count = 0;        // elements of the flat buffer
  int first_tensor = 0, last_tensor = 0;  // layout indices covered, first <= last
};

struct BucketCaps {
  int64_t first_cap_bytes = int64_t{1} << 20;  // 1 MiB
  int64_t cap_bytes = int64_t{25} << 20;       // 25 MiB
  int64_t elem_bytes = 4;
};

// tensors in layout order, non-overlapping, increasing offsets. Throws loom::Error on caps
// below one element or unordered tensors. Buckets come back in launch order.
std::vector<Bucket> assign_buckets(const std::vector<TensorExtent>& tensors, const BucketCaps& caps = {});

}  // namespace loom::parallel
