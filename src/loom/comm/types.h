// Element types, reduction and collective kinds shared by the collective layer, the
// ledger and (later) the cost model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "loom/core/bf16.h"

namespace loom::comm {

// bfloat16 as stored bits, a distinct type so collectives dispatch on it; the rounding is
// loom::to_bf16 (core/bf16.h: nearest even, NaN stays NaN).
struct bf16 {
  uint16_t bits = 0;
};
inline float bf16_to_float(bf16 x) { return loom::from_bf16(x.bits); }
inline bf16 float_to_bf16(float x) { return bf16{loom::to_bf16(x)}; }

enum class DType : uint8_t { kF32, kF64, kBF16, kI32, kI64, kI8, kU8 };
enum class ReduceOp : uint8_t { kSum, kAvg, kMax };
enum class OpKind : uint8_t {
  kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce, kAllToAll, kSend, kRecv, kSendRecvBatch, kBarrier
};
// kAuto asks the cost model; kNative is the backend library's own collective (MPI).
enum class Algorithm : uint8_t { kAuto, kRing, kRecursive, kShm, kHierarchical, kNative };

// Reduced-precision payloads for an f32 all_reduce (Note [Compressed all-reduce]).
enum class Compression : uint8_t { kNone, kBF16, kInt8 };
std::string_view compression_name(Compression c);  // "none", "bf16", "int8"
// Bytes `count` f32 values take on the wire in compression c (Note [Compressed all-reduce]).
size_t compressed_bytes(Compression c, size_t count);

size_t dtype_bytes(DType t);
std::string_view dtype_name(DType t);    // "f32", "bf16", ...
std::string_view reduce_name(ReduceOp r);
std::string_view op_name(OpKind op);     // "all_reduce", ...
std::string_view algorithm_name(Algorithm a);
// Parses "ring", "recursive", "shm", "hierarchical", "native" (alias "mpi"), "auto";
// throws loom::Error listing the names otherwise.
Algorithm parse_algorithm(std::string_view name);
bool dtype_is_float(DType t);

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };
template <> struct DTypeOf<bf16> { static constexpr DType value = DType::kBF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kI8; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };
template <typename T> inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace loom::comm
