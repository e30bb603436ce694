// `loom` subcommands. Each returns the process exit code; errors propagate as loom::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::cli {

// Layout flags of `loom train` / `loom verify`; unset ones (-1 / empty) leave the config alone.
struct LayoutFlags {
  int64_t dp = -1, tp = -1, pp = -1, vpp = -1, zero = -1, micro_batch = -1, grad_accum = -1;
  bool sp = false;
  std::string schedule, recompute, pp_layers;
  // "parallel.dp=2", ... in a fixed order, appended after --set so the flags win.
  std::vector<std::string> as_sets() const;
};

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> sets;
  LayoutFlags layout;
  bool json = false;
  int nproc = 0;  // > 0: relaunch under mpirun with that many ranks
  std::string trace;  // Chrome-trace JSON path
};
// Under mpirun (or with --nproc) trains one rank of the parallel layout.
int run_train(const TrainArgs& a, int argc, char** argv);

struct VerifyArgs {
  std::string configs;  // "dp=2;dp=2,zero=1" or a file with one layout per line
  std::string config_path;
  std::vector<std::string> sets;
  int64_t steps = 20;
  bool json = false;
};
int run_verify(const VerifyArgs& a);

struct SampleArgs {
  std::string checkpoint, prompt;
  int64_t tokens = 200;
  double temperature = 0.8;
  uint64_t seed = 0;
};
int run_sample(const SampleArgs& a);

int run_export(const std::string& checkpoint, const std::string& format, const std::string& out);
int run_import(const std::string& format, const std::string& in, const std::string& checkpoint,
               const std::string& config_path, const std::vector<std::string>& sets);

struct BenchCommArgs {
  std::string op = "all_reduce";
  std::string algorithm = "all";
  std::string sizes = "4K,64K,1M,16M,64M,256M";
  std::string dtype = "f32";
  int iters = 0;
  int threads = 0;  // > 0: run that many ranks as threads in this process instead of MPI
  bool json = false;
  std::string config_path;
  std::vector<std::string> sets;
};
int run_bench_comm(const BenchCommArgs& a);

}  // namespace loom::cli
