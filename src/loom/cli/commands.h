// `loom` subcommands. Each returns the process exit code; errors propagate as loom::Error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/sim/goodput.h"
#include "loom/sim/simulator.h"

namespace CLI {
class App;
}

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
  bool json = false, csv = false;
  int nproc = 0;  // > 0: relaunch under mpirun with that many ranks
  std::string hosts;  // a hostfile or HOST:SLOTS,...: relaunch across those hosts (Note [Host lists])
  std::string elastic;  // MIN:MAX hosts: re-form on the hosts left when some fail (Note [Elastic launch])
  std::string trace;  // Chrome-trace JSON path
  std::string resume;  // auto | DIR (Note [Sharded checkpoints])
  int64_t save_every = -1;
  bool overwrite = false;
  std::string precision;  // train.precision when given
  std::string device;     // train.device when given
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
  std::string checkpoint, prompt, tokenizer;
  int64_t tokens = 200;
  double temperature = 0.8;
  uint64_t seed = 0;
  bool logits = false;  // JSON lines of each step's logits instead of the text
};
int run_sample(const SampleArgs& a);

// A path the user named must exist: a usage error (exit 2) naming the flag otherwise, as in
// every command (issue 59: some said 1, some 2). What is wrong inside an existing file or
// checkpoint stays a runtime error (exit 1).
void require_path(const std::string& path, const std::string& flag);

// `format` hf, or auto and `out` not ending in .safetensors: a model directory (Note
// [Hugging Face directories]) with shards of at most `max_shard_mb` MiB; else one file.
int run_export(const std::string& checkpoint, const std::string& format, const std::string& out,
               const std::string& dtype, bool overwrite, double max_shard_mb);
// `tokenizer` (may be empty) becomes the checkpoint's data.tokenizer, what `loom sample` decodes with.
int run_import(const std::string& format, const std::string& in, const std::string& checkpoint,
               const std::string& config_path, const std::vector<std::string>& sets, const std::string& tokenizer);

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

// `loom simulate` / `loom plan` inputs: the model and run as for `loom train` (--model,
// --config, --set model.* / train.* / parallel.*), the cluster (--cluster, --set
// cluster.*, --gpus), the layout flags, --global-batch, --seq and --cp.
struct SimArgs {
  std::string model, config_path, cluster = "dgx-a100", local_path;
  std::vector<std::string> sets;
  LayoutFlags layout;
  int64_t global_batch = 0, seq = 0, cp = 1, gpus = 0;
  bool json = false, ops = false;  // ops: the cost model's per-op itemization (simulate --ops)
  std::string trace, svg;
  bool overwrite = false;  // --trace/--svg (and plan's --out) may replace a file that is not loom's
  std::string framework;  // loom | megatron | fsdp | deepspeed-2021; empty: loom on a shared-device (CPU) cluster, else megatron
  std::string attention;  // unfused | flash2 | flash3 (Megatron only)
  std::string dp_overlap;     // on (default) | off: gradient reduction overlapped with backward
  bool blocking_p2p = false;  // pipeline sends hold the sender until delivered (Megatron-LM 2021-22)
  std::string tp_overlap;     // on | off (default): Note [Tensor-parallel overlap] in sim/simulator.cc
  std::string param_gather_overlap;  // on | off (default): Note [Parameter-gather overlap]
  double compute_efficiency = 1;     // fraction of the cluster's GEMM/attention rate: Note [Stack efficiency]
  std::string backward_prefetch;     // pre (default) | post: FSDP's BackwardPrefetch, Note [Backward prefetch]
  bool recompute_early_stop = false;  // PyTorch's non-reentrant checkpoint from torch 2.1 (Note [Recompute])
  std::string precision;             // bf16 (default) | fp8 | fp8-current | mxfp8: Note [fp8 GEMMs]
  int64_t activation_offload = 0;    // Megatron's --cpu-offloading-num-layers: Note [Activation offload]
  bool fp8_param_gather = false;     // ZeRO-3 gathers in fp8: Note [fp8 weights under ZeRO-3]
  // Note [Goodput]: per-node MTBF in hours (0: none), measured save and restart seconds.
  double node_mtbf_h = 0, save_s = -1, restart_s = -1;
  int64_t shrink_nodes = 0;  // simulate: the layout after losing this many nodes (Note [Elastic shapes])
};
// Note [Goodput]: the failure model of --node-mtbf-h / --save-s / --restart-s (node_mtbf_s 0
// when none is given). Throws ConfigError when one is given without the others.
sim::FailureModel failure_model(const SimArgs& a);
struct SimInputs {
  sim::SimPlan plan;
  sim::ClusterSpec cluster;
};
// --dp defaults to gpus / (tp x pp x cp), the micro-batch to 1 (then grad_accum = global
// batch / (micro-batch x dp)). Throws ConfigError naming the problem.
SimInputs resolve_sim_inputs(const SimArgs& a);
// $XDG_CACHE_HOME/loom or ~/.cache/loom: cluster-local.toml; bf16: cluster-local-bf16.toml.
std::string default_local_cluster_path(bool bf16 = false);
int run_simulate(const SimArgs& a);

struct PlanArgs {
  SimArgs sim;           // model, cluster, --gpus, --global-batch, --seq, --cp, --json
  int64_t top = 5;
  std::string emit, out; // --emit loom | megatron, written to --out (stdout when empty)
  std::string compress = "auto";  // auto | none | a list of compressors (Note [Gradient compressors])
  std::string ps;                 // "" | dense | sparse: parameter-server layouts tried too
  bool explain = false;           // why #1 beats #2 (Note [Plan explanation])
};
int run_plan(const PlanArgs& a);

struct CalibrateArgs {
  std::string out;        // empty: default_local_cluster_path()
  int threads = 0;
  std::vector<int> ranks = {2, 4};
  std::string precision = "fp32";  // bf16: the `local-bf16` spec (CalibrateOptions::bf16)
  std::string offload_dir = "/var/tmp";  // CalibrateOptions::offload_dir
  int passes = 3;                        // CalibrateOptions::passes
};
int run_calibrate(const CalibrateArgs& a);

// Lines up a simulated and a measured Chrome trace per rank and category.
int run_compare(const std::string& predicted, const std::string& measured, bool json);
int run_ckpt_inspect(const std::string& dir, bool verify);
// `loom ckpt convert`: `sets` are parallel.* overrides (layout flags already turned into sets).
int run_ckpt_convert(const std::string& in, const std::string& out, const std::vector<std::string>& sets);
// Note [Run plots]: curves of the runs' JSON-lines logs, `metrics` comma-separated.
int run_plot(const std::vector<std::string>& runs, const std::string& out, const std::string& metrics, bool overwrite);

// `loom tokenizer encode | decode | train | info` (tokenizer_cmd.cc registers its flags).
struct TokenizerArgs {
  std::string tokenizer, text, in, ids, out, type = "bpe";
  int64_t vocab = 4096;
  bool json = false, plain = false, lines = false, overwrite = false;
};
struct TokenizerCommands {
  CLI::App *encode = nullptr, *decode = nullptr, *train = nullptr, *info = nullptr;
};
TokenizerCommands add_tokenizer_commands(CLI::App& app, TokenizerArgs& a);
int run_tokenizer(const TokenizerCommands& c, const TokenizerArgs& a);

// `loom data prepare | inspect` (data_cmd.cc).
struct DataArgs {
  std::string tokenizer, in, out, text_field = "text", doc_separator;
  std::string config_path;         // batches: the training config
  std::vector<std::string> sets;   // batches: its overrides
  int64_t steps = 0;               // batches: steps to write (0: train.steps)
  int64_t shard_tokens = 100'000'000;
  int64_t piece_bytes = int64_t(1) << 18;  // Note [Document pieces]
  double val_fraction = 0.05;
  int threads = 2;
  bool overwrite = false, json = false;
};
struct DataCommands {
  CLI::App *prepare = nullptr, *inspect = nullptr, *batches = nullptr;
};
DataCommands add_data_commands(CLI::App& app, DataArgs& a);
int run_data(const DataCommands& c, const DataArgs& a);

}  // namespace loom::cli
