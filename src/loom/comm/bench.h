// `loom bench comm`: an nccl-tests style sweep over collectives, algorithms and sizes,
// with a correctness check of every result and the library's own collective (called the
// way a user calls it) measured in the same run.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/comm/types.h"

namespace loom::comm {

class World;

// "4K,1M,7M+13" -> {4096, 1048576, 7340045}; K/M/G are binary (2^10, 2^20, 2^30).
// Throws loom::Error naming the bad item.
std::vector<size_t> parse_sizes(std::string_view list);

// nccl-tests: busbw = algbw x bus_factor (comm/cost.h), with algbw = bytes / time.

struct BenchRequest {
  std::vector<OpKind> ops;
  // "all", or names: auto, shm, hierarchical, ring, recursive, native, mpi; an f32
  // all_reduce may add a payload compression: "ring+bf16", "ring+int8".
  std::vector<std::string> algorithms;
  std::vector<size_t> sizes_bytes;
  DType dtype = DType::kF32;
  int iters = 0;  // 0: as many as fit in ~0.3 s, at least 5
};

struct BenchRow {
  OpKind op = OpKind::kAllReduce;
  std::string algorithm;
  size_t bytes = 0, count = 0;
  int ranks = 1, iters = 0;
  double median_us = 0, min_us = 0, max_us = 0;
  double algbw_gbps = 0, busbw_gbps = 0;
  bool correct = false;
  double max_rel_error = 0;  // max |got - exact| / max sum|x|; nonzero only with compression
};

// The library's own blocking collective on the whole world (the "mpi" rows).
using PeerCollective = std::function<void(OpKind op, std::span<const std::byte> in, std::span<std::byte> out,
                                          size_t count, DType dtype)>;

// Collective over the world; every rank gets the rows, on_row is called as each finishes.
std::vector<BenchRow> run_comm_bench(World& world, const BenchRequest& request, const PeerCollective& peer,
                                     const std::function<void(const BenchRow&)>& on_row);

// One core's memcpy bandwidth (best of 3 copies of 256 MiB), GB/s: the yardstick for the
// memory-bandwidth bound of a shared-memory all-reduce.
double measure_copy_gbps();
// Rank 0's closing lines: per size, the best loom algorithm's busbw against the mpi row
// and, for 2-rank all_reduce, against the published memory-bandwidth bound.
std::string bench_summary(const std::vector<BenchRow>& rows);

std::string bench_row_json(const BenchRow& row, DType dtype);
std::string bench_table_header();
std::string bench_row_text(const BenchRow& row);

}  // namespace loom::comm
