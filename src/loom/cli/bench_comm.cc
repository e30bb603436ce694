// `loom bench comm`: see loom/comm/bench.h.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "loom/cli/commands.h"
#include "loom/comm/bench.h"
#include "loom/comm/mpi_backend.h"
#include "loom/comm/thread_backend.h"
#include "loom/comm/world.h"
#include "loom/core/config.h"

namespace loom::cli {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

std::vector<comm::OpKind> parse_ops(const std::string& text) {
  using comm::OpKind;
  const std::vector<std::pair<std::string, OpKind>> known = {{"all_reduce", OpKind::kAllReduce},
                                                             {"reduce_scatter", OpKind::kReduceScatter},
                                                             {"all_gather", OpKind::kAllGather},
                                                             {"broadcast", OpKind::kBroadcast},
                                                             {"all_to_all", OpKind::kAllToAll}};
  std::vector<OpKind> out;
  for (const std::string& name : split(text)) {
    if (name == "all") {
      for (const auto& [n, op] : known) out.push_back(op);
      continue;
    }
    bool found = false;
    for (const auto& [n, op] : known)
      if (n == name) {
        out.push_back(op);
        found = true;
      }
    if (!found)
      throw ConfigError("unknown --op '" + name + "'; expected all_reduce, reduce_scatter, all_gather, broadcast, "
                        "all_to_all or all");
  }
  return out;
}

void run_on(comm::World& world, const comm::BenchRequest& req, const comm::PeerCollective& peer, bool json) {
  const bool printer = world.global_rank() == 0;
  double copy_gbps = 0;
  if (printer && !json) copy_gbps = comm::measure_copy_gbps();
  world.world_group().barrier();
  if (printer && !json) {
    std::printf("# one core copies %.1f GB/s here (memcpy of 256 MiB, bytes copied per second)\n", copy_gbps);
    std::printf("# loom bench comm: %d ranks on %s, dtype %s, comm.timeout_s %.0f\n", world.world_size(),
                world.backend().name().c_str(), std::string(comm::dtype_name(req.dtype)).c_str(),
                world.options().timeout.count() * 1e-3);
    std::printf("# bytes as nccl-tests counts them; busbw = algbw x bus factor; GB/s = 1e9 bytes/s\n%s\n",
                comm::bench_table_header().c_str());
    std::fflush(stdout);
  }
  bool all_correct = true;
  const std::vector<comm::BenchRow> rows = comm::run_comm_bench(world, req, peer, [&](const comm::BenchRow& row) {
    all_correct = all_correct && row.correct;
    if (!printer) return;
    std::printf("%s\n", json ? comm::bench_row_json(row, req.dtype).c_str() : comm::bench_row_text(row).c_str());
    std::fflush(stdout);
  });
  if (printer && !json) std::printf("%s", comm::bench_summary(rows).c_str());
  if (!all_correct) throw Error("bench comm: some results were wrong (rows with correct = NO / false)");
}

}  // namespace

int run_bench_comm(const BenchCommArgs& a) {
  const Config config = load_config(a.config_path, a.sets);
  comm::CommOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.comm.timeout_s * 1000));
  options.check_desync = config.comm.check_desync;
  comm::BenchRequest req;
  req.ops = parse_ops(a.op);
  req.algorithms = split(a.algorithm);
  for (const std::string& alg : req.algorithms)
    if (alg != "all" && alg != "mpi") comm::parse_algorithm(alg.substr(0, alg.find('+')));  // throws on unknown
  req.sizes_bytes = comm::parse_sizes(a.sizes);
  if (a.dtype == "f32") req.dtype = comm::DType::kF32;
  else if (a.dtype == "bf16") req.dtype = comm::DType::kBF16;
  else throw ConfigError("--dtype must be f32 or bf16, got '" + a.dtype + "'");
  LOOM_CHECK(a.iters >= 0, "--iters must be >= 0, got ", a.iters);
  req.iters = a.iters;
  if (a.threads > 0) {
    std::vector<std::string> errors = comm::run_threads(a.threads, options, [&](comm::World& w) {
      run_on(w, req, nullptr, a.json);
    });
    for (const std::string& e : errors)
      if (!e.empty()) throw Error(e);
    return 0;
  }
  LOOM_CHECK(a.threads == 0, "--threads must be > 0, got ", a.threads);
  comm::World world(comm::make_mpi_backend(), options);
  run_on(world, req, comm::mpi_user_collective, a.json);
  return 0;
}

}  // namespace loom::cli
