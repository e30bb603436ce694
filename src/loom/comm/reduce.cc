// Local reduction kernels used by the algorithms (one element type per loop so the
// compiler vectorises them).
#include <algorithm>
#include <cstring>

#include "loom/comm/algorithms.h"
#include "loom/core/error.h"
#include "loom/core/even_split.h"

namespace loom::comm {
namespace {

template <typename T>
void reduce_typed(ReduceOp op, std::byte* acc_b, const std::byte* x_b, size_t n) {
  T* acc = reinterpret_cast<T*>(acc_b);
  const T* x = reinterpret_cast<const T*>(x_b);
  if (op == ReduceOp::kMax) {
    for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] += x[i];
  }
}

void reduce_bf16(ReduceOp op, std::byte* acc_b, const std::byte* x_b, size_t n) {
  bf16* acc = reinterpret_cast<bf16*>(acc_b);
  const bf16* x = reinterpret_cast<const bf16*>(x_b);
  for (size_t i = 0; i < n; ++i) {
    const float a = bf16_to_float(acc[i]), b = bf16_to_float(x[i]);
    acc[i] = float_to_bf16(op == ReduceOp::kMax ? std::max(a, b) : a + b);
  }
}

}  // namespace

void reduce_into(DType dtype, ReduceOp op, std::byte* acc, const std::byte* x, size_t count) {
  switch (dtype) {
    case DType::kF32: return reduce_typed<float>(op, acc, x, count);
    case DType::kF64: return reduce_typed<double>(op, acc, x, count);
    case DType::kBF16: return reduce_bf16(op, acc, x, count);
    case DType::kI32: return reduce_typed<int32_t>(op, acc, x, count);
    case DType::kI64: return reduce_typed<int64_t>(op, acc, x, count);
    case DType::kI8: return reduce_typed<int8_t>(op, acc, x, count);
    case DType::kU8: return reduce_typed<uint8_t>(op, acc, x, count);
  }
}

void divide(DType dtype, std::byte* data, size_t count, int divisor) {
  switch (dtype) {
    case DType::kF32: {
      float* p = reinterpret_cast<float*>(data);
      const float s = 1.0f / static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) p[i] *= s;
      return;
    }
    case DType::kF64: {
      double* p = reinterpret_cast<double*>(data);
      const double s = 1.0 / divisor;
      for (size_t i = 0; i < count; ++i) p[i] *= s;
      return;
    }
    case DType::kBF16: {
      bf16* p = reinterpret_cast<bf16*>(data);
      const float s = 1.0f / static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) * s);
      return;
    }
    default: LOOM_ASSERT(false, "avg on integer dtype ", dtype_name(dtype), " passed validation");
  }
}

Chunk chunk_of(size_t count, int parts, int i) {
  const EvenChunk c = even_chunk(int64_t(count), parts, i);
  return {size_t(c.begin), size_t(c.count)};
}

}  // namespace loom::comm
