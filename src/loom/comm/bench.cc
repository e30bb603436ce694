#include "loom/comm/bench.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cctype>
#include <cmath>
#include <cstring>

#include "loom/comm/cost.h"
#include "loom/comm/world.h"

namespace loom::comm {

std::vector<size_t> parse_sizes(std::string_view list) {
  std::vector<size_t> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item(list.substr(pos, comma - pos));
    pos = comma + 1;
    auto bad = [&] {
      return ConfigError(detail::cat("bad size '", item, "' in --sizes: expected bytes with an optional K/M/G suffix and "
                                     "an optional +N, e.g. 4K,1M,7M+13"));
    };
    if (item.empty()) throw bad();
    size_t i = 0;
    unsigned long long value = 0;
    while (i < item.size() && std::isdigit(static_cast<unsigned char>(item[i]))) {
      value = value * 10 + (item[i++] - '0');
      if (value > (1ull << 40)) throw bad();
    }
    if (i == 0) throw bad();
    if (i < item.size() && std::strchr("KMG", item[i])) {
      value <<= item[i] == 'K' ? 10 : item[i] == 'M' ? 20 : 30;
      ++i;
    }
    if (i < item.size() && item[i] == '+') {
      ++i;
      unsigned long long extra = 0;
      const size_t start = i;
      while (i < item.size() && std::isdigit(static_cast<unsigned char>(item[i]))) extra = extra * 10 + (item[i++] - '0');
      if (i == start) throw bad();
      value += extra;
    }
    if (i != item.size()) throw bad();
    out.push_back(value);
  }
  return out;
}

namespace {

// Input pattern whose sums are small integers, exact in f32 and bf16 for up to 85 ranks.
// Compressed rows use values no short format holds exactly, so the error shows.
float pattern(int rank, size_t i, bool rough) {
  return rough ? std::sin(0.37f * static_cast<float>(i % 100003) + static_cast<float>(rank))
               : static_cast<float>((rank + i) % 4);
}

struct Buffers {
  std::vector<std::byte> in, out;
  size_t count = 0;  // Note [Descriptor counts]
};

void fill(std::vector<std::byte>& buf, DType dtype, int rank, size_t offset_elems, bool zero, bool rough) {
  const size_t n = buf.size() / dtype_bytes(dtype);
  for (size_t i = 0; i < n; ++i) {
    const float v = zero ? 0.f : pattern(rank, offset_elems + i, rough);
    if (dtype == DType::kBF16) reinterpret_cast<bf16*>(buf.data())[i] = float_to_bf16(v);
    else reinterpret_cast<float*>(buf.data())[i] = v;
  }
}

float element(const std::vector<std::byte>& buf, DType dtype, size_t i) {
  return dtype == DType::kBF16 ? bf16_to_float(reinterpret_cast<const bf16*>(buf.data())[i])
                               : reinterpret_cast<const float*>(buf.data())[i];
}

// Buffer sizes per op for a "bytes" figure as nccl-tests counts it.
Buffers make_buffers(OpKind op, size_t bytes, DType dtype, int n) {
  const size_t es = dtype_bytes(dtype);
  Buffers b;
  size_t total = bytes / es;
  if (op == OpKind::kReduceScatter || op == OpKind::kAllGather || op == OpKind::kAllToAll) total -= total % n;
  const size_t per_rank = total / n;
  switch (op) {
    case OpKind::kReduceScatter: b.count = per_rank; b.in.resize(total * es); b.out.resize(per_rank * es); break;
    case OpKind::kAllGather: b.count = per_rank; b.in.resize(per_rank * es); b.out.resize(total * es); break;
    case OpKind::kAllToAll: b.count = per_rank; b.in.resize(total * es); b.out.resize(total * es); break;
    default: b.count = total; b.out.resize(total * es);
  }
  return b;
}

// Expected value of output element i on `rank` for the pattern above.
double expected(OpKind op, int n, int rank, size_t count, size_t i, bool rough) {
  auto pattern = [rough](int r, size_t j) { return ::loom::comm::pattern(r, j, rough); };
  double sum = 0;
  switch (op) {
    case OpKind::kAllReduce:
      for (int r = 0; r < n; ++r) sum += pattern(r, i);
      return sum;
    case OpKind::kReduceScatter:
      for (int r = 0; r < n; ++r) sum += pattern(r, rank * count + i);
      return sum;
    case OpKind::kAllGather: return pattern(static_cast<int>(i / count), i % count);
    case OpKind::kAllToAll: return pattern(static_cast<int>(i / count), rank * count + i % count);
    case OpKind::kBroadcast: return pattern(0, i);
    default: return 0;
  }
}

struct Runner {
  World& world;
  const PeerCollective& peer;
  DType dtype;
  bool rough = false;  // set for compressed rows

  void reset(OpKind op, Buffers& b, bool zero) {
    const int r = world.global_rank();
    if (op == OpKind::kAllReduce) fill(b.out, dtype, r, 0, zero, rough);
    else if (op == OpKind::kBroadcast) fill(b.out, dtype, r == 0 ? 0 : 99, 0, zero, rough);
    else fill(b.in, dtype, r, 0, zero, rough);
  }

  // "ring+int8" -> (ring, int8)
  static std::pair<Algorithm, Compression> parse(const std::string& name) {
    const size_t plus = name.find('+');
    Compression c = Compression::kNone;
    if (plus != std::string::npos) {
      const std::string tail = name.substr(plus + 1);
      if (tail == "bf16") c = Compression::kBF16;
      else if (tail == "int8") c = Compression::kInt8;
      else throw ConfigError("unknown compression '" + tail + "' in --algorithm " + name + "; expected bf16 or int8");
    }
    return {parse_algorithm(name.substr(0, plus)), c};
  }

  void once(OpKind op, const std::string& algorithm, Buffers& b) {
    if (algorithm == "mpi") return peer(op, op == OpKind::kAllReduce || op == OpKind::kBroadcast ? std::span<const std::byte>(b.out)
                                                                                                  : std::span<const std::byte>(b.in),
                                        b.out, b.count, dtype);
    Descriptor d;
    d.op = op;
    d.dtype = dtype;
    d.count = b.count;
    d.in = op == OpKind::kAllReduce || op == OpKind::kBroadcast ? std::span<const std::byte>(b.out) : std::span<const std::byte>(b.in);
    d.out = b.out;
    const auto [a, c] = parse(algorithm);
    world.world_group().submit(std::move(d), {.algorithm = a, .compression = c});
  }

  // Exact results must match bit for bit; compressed ones within Note [Compressed
  // all-reduce]'s bound (one half quantisation step per hop, n hops). Returns the error.
  bool check(OpKind op, const std::string& algorithm, const Buffers& b, double* max_rel_error) {
    const int n = world.world_size(), r = world.global_rank();
    const size_t total = b.out.size() / dtype_bytes(dtype);
    double err = 0, scale = 0;
    for (size_t i = 0; i < total; ++i) {
      const double want = expected(op, n, r, b.count, i, rough);
      err = std::max(err, std::fabs(element(b.out, dtype, i) - want));
      // Relative to the largest partial sum any hop can carry: sum over ranks of |x|.
      double abs_sum = std::fabs(want);
      if (rough && op == OpKind::kAllReduce) {
        abs_sum = 0;
        for (int k = 0; k < n; ++k) abs_sum += std::fabs(pattern(k, i, true));
      }
      scale = std::max(scale, abs_sum);
    }
    double rel = scale > 0 ? err / scale : err;
    world.world_group().all_reduce(std::span(&rel, 1), ReduceOp::kMax);
    *max_rel_error = rel;
    const Compression c = algorithm == "mpi" ? Compression::kNone : parse(algorithm).second;
    const double allowed = c == Compression::kNone ? 0.0 : c == Compression::kBF16 ? n / 256.0 : n / 254.0;
    return rel <= allowed;
  }
};

}  // namespace

std::vector<BenchRow> run_comm_bench(World& world, const BenchRequest& req, const PeerCollective& peer,
                                     const std::function<void(const BenchRow&)>& on_row) {
  LOOM_CHECK(req.dtype == DType::kF32 || req.dtype == DType::kBF16, "bench comm: --dtype must be f32 or bf16, got ",
             dtype_name(req.dtype));
  const int n = world.world_size();
  Runner run{world, peer, req.dtype};
  std::vector<BenchRow> rows;
  for (OpKind op : req.ops) {
    std::vector<std::string> algorithms = req.algorithms;
    if (algorithms.size() == 1 && algorithms[0] == "all") {
      const Group& g = world.world_group();
      algorithms = {"auto"};
      if (op == OpKind::kAllReduce) {
        if (g.has_shared_memory()) algorithms.push_back("shm");
        if (g.nodes() > 1) algorithms.push_back("hierarchical");
        algorithms.push_back("ring");
        algorithms.push_back("recursive");
      }
      if (op == OpKind::kAllReduce && req.dtype == DType::kF32) {
        algorithms.push_back("ring+bf16");
        algorithms.push_back("ring+int8");
      }
      if (g.has_native() && req.dtype != DType::kBF16) algorithms.push_back("native");
      if (peer && req.dtype != DType::kBF16) algorithms.push_back("mpi");
    }
    for (const std::string& algorithm : algorithms) {
      LOOM_CHECK(algorithm != "mpi" || peer, "bench comm: algorithm mpi needs the MPI backend (run under mpirun)");
      for (size_t bytes : req.sizes_bytes) {
        Buffers b = make_buffers(op, bytes, req.dtype, n);
        BenchRow row;
        row.op = op;
        row.algorithm = algorithm;
        row.count = b.count;
        row.ranks = n;
        row.bytes = std::max(b.in.size(), b.out.size());
        // Warm-up with the pattern (also faults the pages in), checked once.
        run.rough = algorithm.find('+') != std::string::npos;
        run.reset(op, b, false);
        run.once(op, algorithm, b);
        row.correct = run.check(op, algorithm, b, &row.max_rel_error);
        run.reset(op, b, true);
        double first = 0;
        {
          world.world_group().barrier();
          const Clock::time_point t0 = Clock::now();
          run.once(op, algorithm, b);
          first = std::chrono::duration<double>(Clock::now() - t0).count();
          world.world_group().all_reduce(std::span(&first, 1), ReduceOp::kMax);
        }
        row.iters = req.iters > 0 ? req.iters : static_cast<int>(std::clamp(0.3 / std::max(first, 1e-7), 5.0, 500.0));
        std::vector<double> times(row.iters);
        for (int it = 0; it < row.iters; ++it) {
          world.world_group().barrier();
          const Clock::time_point t0 = Clock::now();
          run.once(op, algorithm, b);
          times[it] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        }
        world.world_group().all_reduce(std::span(times), ReduceOp::kMax);  // an iteration ends on the slowest rank
        std::sort(times.begin(), times.end());
        row.median_us = times[times.size() / 2];
        row.min_us = times.front();
        row.max_us = times.back();
        row.algbw_gbps = row.median_us > 0 ? row.bytes / (row.median_us * 1e3) : 0;
        row.busbw_gbps = row.algbw_gbps * bus_factor(op, n);
        rows.push_back(row);
        if (on_row) on_row(row);
      }
    }
  }
  return rows;
}

double measure_copy_gbps() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const Clock::time_point t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    a[i] = b[bytes - 1 - i];  // keep the copies observable
  }
  return bytes / best * 1e-9;
}

std::string bench_summary(const std::vector<BenchRow>& rows) {
  std::string out;
  char buf[256];
  for (const BenchRow& peer : rows) {
    if (peer.algorithm != "mpi") continue;
    const BenchRow* best = nullptr;
    for (const BenchRow& r : rows)
      if (r.op == peer.op && r.bytes == peer.bytes && r.algorithm != "mpi" && r.algorithm != "native" &&
          r.algorithm.find('+') == std::string::npos &&
          (!best || r.median_us < best->median_us))
        best = &r;
    if (!best) continue;
    std::snprintf(buf, sizeof buf, "# %-14s %12zu bytes: best loom %-10s %8.3f GB/s busbw = %6.2fx mpi (%8.3f GB/s)",
                  std::string(op_name(peer.op)).c_str(), peer.bytes, best->algorithm.c_str(), best->busbw_gbps,
                  peer.median_us / best->median_us, peer.busbw_gbps);
    out += buf;
    if (peer.op == OpKind::kAllReduce && peer.ranks == 2) {
      // The bound for this machine type: one core copies ~30 GB/s, so a 2-rank
      // shared-memory all-reduce reaches at most ~7.5-9 GB/s busbw. The upper end is used.
      std::snprintf(buf, sizeof buf, "; %3.0f%% of the 9 GB/s memory bound", 100.0 * best->busbw_gbps / 9.0);
      out += buf;
    }
    out += "\n";
  }
  return out;
}

std::string bench_row_json(const BenchRow& r, DType dtype) {
  nlohmann::json j = {{"op", op_name(r.op)},     {"algorithm", r.algorithm}, {"bytes", r.bytes},
                      {"count", r.count},         {"ranks", r.ranks},         {"dtype", dtype_name(dtype)},
                      {"iters", r.iters},         {"time_us", r.median_us},   {"min_us", r.min_us},
                      {"max_us", r.max_us},       {"algbw_gbps", r.algbw_gbps}, {"busbw_gbps", r.busbw_gbps},
                      {"correct", r.correct},     {"max_rel_error", r.max_rel_error}};
  return j.dump();
}

std::string bench_table_header() {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-15s %-12s %12s %12s %6s %12s %12s %12s %10s %10s %8s %9s", "op", "algorithm",
                "bytes", "count", "ranks", "time_us", "min_us", "max_us", "algbw", "busbw", "correct", "rel_err");
  return std::string(buf) + "\n" + std::string(std::strlen(buf), '-');
}

std::string bench_row_text(const BenchRow& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-15s %-12s %12zu %12zu %6d %12.1f %12.1f %12.1f %10.3f %10.3f %8s %9.2e",
                std::string(op_name(r.op)).c_str(), r.algorithm.c_str(), r.bytes, r.count, r.ranks, r.median_us,
                r.min_us, r.max_us, r.algbw_gbps, r.busbw_gbps, r.correct ? "yes" : "NO", r.max_rel_error);
  return buf;
}

}  // namespace loom::comm
