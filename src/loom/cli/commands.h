// `loom` subcommands. Each returns the process exit code; errors propagate as loom::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::cli {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> sets;
  bool json = false;
};
int run_train(const TrainArgs& a);

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
