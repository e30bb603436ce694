#include "loom/comm/types.h"

#include <cstring>

#include "loom/core/error.h"

namespace loom::comm {

size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kBF16: return 2;
    case DType::kI8: case DType::kU8: return 1;
  }
  LOOM_ASSERT(false, "unknown dtype ", int(t));
}

bool dtype_is_float(DType t) { return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16; }

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
  }
  return "?";
}

std::string_view reduce_name(ReduceOp r) {
  switch (r) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

std::string_view op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kSendRecvBatch: return "p2p_batch";
    case OpKind::kBarrier: return "barrier";
  }
  return "?";
}

std::string_view compression_name(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kBF16: return "bf16";
    case Compression::kInt8: return "int8";
  }
  return "?";
}

std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kRecursive: return "recursive";
    case Algorithm::kShm: return "shm";
    case Algorithm::kHierarchical: return "hierarchical";
    case Algorithm::kNative: return "native";
  }
  return "?";
}

Algorithm parse_algorithm(std::string_view name) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursive, Algorithm::kShm,
                      Algorithm::kHierarchical, Algorithm::kNative})
    if (name == algorithm_name(a)) return a;
  if (name == "mpi") return Algorithm::kNative;
  throw ConfigError(detail::cat("unknown collective algorithm '", name,
                                "'; expected auto, ring, recursive, shm, hierarchical or native (mpi)"));
}

}  // namespace loom::comm
