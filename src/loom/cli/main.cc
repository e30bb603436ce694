// loom command line. Exit codes: 0 success, 2 usage or config error, 1 runtime failure.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdlib>
#include <functional>
#include <iostream>

#include "loom/cli/commands.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/omp_wait.h"

namespace {

std::string config_keys_footer() {
  std::string s = "\nConfig keys (set in a TOML [section] or with --set section.key=value):\n";
  for (const auto& [k, help] : loom::config_key_help()) {
    s += "  " + k + std::string(k.size() < 24 ? 24 - k.size() : 1, ' ') + help + "\n";
  }
  return s;
}

// Integer flags below `lo` are refused like the config keys they set (exit 2, naming the value).
CLI::Validator at_least(long long lo, long long hi = LLONG_MAX) {
  const std::string what = hi != LLONG_MAX ? "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"
                           : lo == 0        ? "an integer >= 0"
                           : lo == 1        ? "a positive integer"
                                            : "an integer >= " + std::to_string(lo);
  return CLI::Validator(
      [lo, hi, what](std::string& s) -> std::string {
        try {
          size_t pos = 0;
          const long long v = std::stoll(s, &pos);
          if (pos == s.size() && v >= lo && v <= hi) return "";
        } catch (...) {
        }
        return "expected " + what + ", got '" + s + "'";
      },
      what);
}

void add_layout_flags(CLI::App* app, loom::cli::LayoutFlags& f) {
  app->add_option("--dp", f.dp, "data-parallel degree (parallel.dp)")->check(at_least(1));
  app->add_option("--tp", f.tp, "tensor-parallel degree (parallel.tp)")->check(at_least(1));
  app->add_option("--pp", f.pp, "pipeline stages (parallel.pp)")->check(at_least(1));
  app->add_option("--vpp", f.vpp, "model chunks per pipeline rank (parallel.vpp)")->check(at_least(1));
  app->add_flag("--sp", f.sp, "sequence parallel (parallel.sp)");
  app->add_option("--zero", f.zero, "ZeRO stage 0-3 (parallel.zero)")->check(at_least(0, 3));
  app->add_option("--micro-batch", f.micro_batch, "sequences per micro-batch per dp rank (parallel.micro_batch)")->check(at_least(0));
  app->add_option("--grad-accum", f.grad_accum, "micro-batches per step (train.grad_accum)")->check(at_least(1));
  app->add_option("--schedule", f.schedule, "gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | zb-v | 2bw | pipedream | pipemare (parallel.schedule)");
  app->add_option("--recompute", f.recompute, "none | selective | full (parallel.recompute)");
  app->add_option("--pp-layers", f.pp_layers, "layers per stage, e.g. 3,4 (parallel.pp_layers)");
}

void add_sim_flags(CLI::App* app, loom::cli::SimArgs& a) {
  app->add_option("--model", a.model, "Model preset (see loom train --help), or custom with --set model.*");
  app->add_option("--config", a.config_path, "TOML config for the model and run");
  app->add_option("--set", a.sets, "Override a key: model.*, train.*, parallel.*, cluster.* (repeatable)")->take_all();
  app->add_option("--node-mtbf-h", a.node_mtbf_h,
                  "Mean hours between failures of one node: report the expected goodput and the save interval "
                  "that maximises it (Daly; needs --save-s and --restart-s)");
  app->add_option("--save-s", a.save_s, "Measured seconds of one checkpoint save (with --node-mtbf-h)");
  app->add_option("--restart-s", a.restart_s,
                  "Measured seconds from a failure to the first step of the restarted job (with --node-mtbf-h)");
  app->add_option("--cluster", a.cluster, "dgx-a100 | dgx-h100 | dgx-b200 | gb200-nvl72 | gb300-nvl72 | dgx-v100 | local (from loom calibrate) | local-bf16 (calibrate --precision bf16) | FILE.toml")
      ->capture_default_str();
  app->add_option("--gpus", a.gpus, "Devices: sets the node count; --dp defaults to gpus / (tp x pp x cp)")
      ->check(at_least(1));
  app->add_option("--global-batch", a.global_batch, "Sequences per optimizer step (train.batch)")
      ->check(at_least(1));
  app->add_option("--seq", a.seq, "Tokens per sequence (train.seq; default model.ctx)")->check(at_least(1));
  app->add_option("--cp", a.cp, "Context-parallel degree (GPU frameworks: priced as ring attention; "
                               "--framework loom: as parallel.cp_mode, allgather, ring or ulysses, e.g. --set parallel.cp_mode=ring)")->capture_default_str();
  app->add_flag("--json", a.json, "One JSON object per result (step_time_s, tokens_per_s, tflops_per_gpu, mfu, hfu, "
                                  "bubble_fraction, peak_memory_bytes, breakdown, memory per rank)");
  app->add_option("--framework", a.framework,
                  "loom | megatron | fsdp | deepspeed-2021: whose activations, dropout, precision and ZeRO to model "
                  "(megatron: ZeRO 0-1; fsdp: PyTorch FSDP, ZeRO 0/2/3 coalesced and prefetched; deepspeed-2021: "
                  "DeepSpeed's 2021 ZeRO-3, per-tensor and unoverlapped). Default: loom on a calibrated CPU "
                  "cluster, megatron on GPU presets");
  app->add_option("--attention", a.attention, "unfused | flash1 | flash2 | flash3: Megatron's attention kernel: "
                                              "unfused (Megatron-LM 2021-22, the default), FlashAttention-1 or -2, "
                                              "or a Hopper kernel (FlashAttention-3, Transformer Engine's cuDNN); "
                                              "flash kernels count causal-half FLOPs and keep no (s, s) scores")
      ->check(CLI::IsMember({"unfused", "flash1", "flash2", "flash3"}));
  app->add_option("--dp-overlap", a.dp_overlap, "on | off: data-parallel gradient reduction overlapped with "
                                                "backward (Megatron-core --overlap-grad-reduce, torch DDP: on; "
                                                "Megatron-LM's 2021-22 local DDP: off). Default on")
      ->check(CLI::IsMember({"on", "off"}));
  app->add_flag("--blocking-p2p", a.blocking_p2p, "Pipeline sends hold the sending rank until delivered "
                                                  "(Megatron-LM's batched isend/irecv + wait); default asynchronous");
  app->add_option("--tp-overlap", a.tp_overlap, "on | off: tensor-parallel collectives hidden under their GEMMs "
                                                "(Megatron-core --tp-comm-overlap). Default off")
      ->check(CLI::IsMember({"on", "off"}));
  app->add_option("--param-gather-overlap", a.param_gather_overlap,
                  "on | off: ZeRO-1/2's parameter all-gather hidden under the next step's forward but for its first "
                  "bucket (Megatron-core --overlap-param-gather). Default off")
      ->check(CLI::IsMember({"on", "off"}));
  app->add_option("--backward-prefetch", a.backward_prefetch,
                  "pre | post: when PyTorch FSDP gathers backward's next unit - before the current unit's gradients "
                  "(BACKWARD_PRE, torch's default) or after them (BACKWARD_POST, Composer's default), exposing the "
                  "gather (Note [Backward prefetch]; --framework fsdp). Default pre")
      ->check(CLI::IsMember({"pre", "post"}));
  app->add_flag("--recompute-early-stop", a.recompute_early_stop,
                "A fully recomputed block stops before the MLP's output projection, as PyTorch's non-reentrant "
                "checkpoint does from torch 2.1 on and loom's engine always (Note [Recompute]; --framework fsdp). "
                "Default: the whole block, as Megatron recomputes");
  app->add_option("--precision", a.precision,
                  "bf16 | fp8 | fp8-current | mxfp8 | nvfp4: the transformer blocks' linear layers (Note [fp8 GEMMs], Note [NVFP4 GEMMs]; "
                  "attention, norms and the head stay bf16)");
  app->add_option("--activation-offload", a.activation_offload,
                  "N: the first N layers' saved activations kept in host memory between their passes (Megatron-core "
                  "--cpu-offloading-num-layers; pp 1, no recompute, a cluster with device.host_gbps: Note [Activation "
                  "offload]). Default 0")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--fp8-param-gather", a.fp8_param_gather,
               "ZeRO-3 gathers the weights' fp8 values (Megatron --fp8-param-gather, FSDP2's float8 all-gather; "
               "with --precision fp8/mxfp8/nvfp4 and --framework fsdp: Note [fp8 weights under ZeRO-3])");
  app->add_option("--compute-efficiency", a.compute_efficiency,
                  "Fraction of the cluster's GEMM and attention rate your stack's kernels reach (an older or less "
                  "tuned stack on the same device; Note [Stack efficiency]). Default 1");
  add_layout_flags(app, a.layout);
}

// One write(2) per error, so that the lines of ranks sharing a terminal never run
// together; under MPI each names its rank.
void print_error(const std::string& what) {
  std::cerr.flush();
  std::string line = "loom: error: ";
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!rank) rank = std::getenv("PMI_RANK");
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!size) size = std::getenv("PMI_SIZE");
  if (rank && size && std::string(size) != "1") line += "rank " + std::string(rank) + ": ";
  line += what + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
}

// Every subcommand's flags, bound while the parser is built and read after it ran.
struct Args {
  loom::cli::TrainArgs train;
  loom::cli::VerifyArgs verify;
  loom::cli::SimArgs sim;
  loom::cli::PlanArgs plan;
  loom::cli::CalibrateArgs calibrate;
  std::string cmp_pred, cmp_meas;
  bool cmp_json = false;
  std::string ck_dir;
  bool ck_verify = false;
  std::string cv_in, cv_out;
  std::vector<std::string> cv_sets;
  loom::cli::LayoutFlags cv_layout;
  loom::cli::SampleArgs sample;
  std::string ex_ck, ex_fmt = "auto", ex_out, ex_dtype = "fp32";
  bool ex_overwrite = false;
  std::vector<std::string> plot_runs;
  std::string plot_out, plot_metrics = "loss,val_loss,tokens_per_s,lr";
  bool plot_overwrite = false;
  double ex_shard_mb = 5000;
  std::string im_in, im_fmt = "auto", im_ck, im_cfg, im_tok;
  std::vector<std::string> im_sets;
  loom::cli::BenchCommArgs bench;
  loom::cli::TokenizerArgs tokenizer;
  loom::cli::DataArgs data;
};

// A parsed subcommand and what runs it (its exit code).
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

void add_train_commands(CLI::App& app, Args& a, std::vector<Command>& cmds, int argc, char** argv) {
  loom::cli::TrainArgs& train = a.train;
  auto* t = app.add_subcommand("train", "Train a model on a text corpus and save a checkpoint");
  t->add_option("--config,--plan", train.config_path, "TOML config file (sections model, data, train, optim, checkpoint, comm, parallel); a plan from loom plan --emit loom is one");
  t->add_option("--set", train.sets, "Override one config key: section.key=value (repeatable)")->take_all();
  auto* json_flag =
      t->add_flag("--json", train.json, "Print one JSON object per line (step, loss, tokens_per_s; val lines add val_loss)");
  t->add_flag("--csv", train.csv, "Print comma-separated rows of the same fields, a header first")->excludes(json_flag);
  add_layout_flags(t, train.layout);
  t->add_option("--nproc", train.nproc, "Run the layout's ranks here: relaunches itself under mpirun -np N")
      ->check(at_least(1));
  t->add_option("--hosts", train.hosts,
                "Run the layout's ranks across hosts: a hostfile of lines HOST slots=N (OpenMPI's and DeepSpeed's "
                "format) or HOST:SLOTS,...; relaunches itself under mpirun --host and supervises every rank");
  t->add_option("--elastic", train.elastic,
                "MIN:MAX hosts, with --hosts: when hosts fail, go on without them (spares from the host list fill in) "
                "on a re-planned layout from the newest checkpoint, while MIN remain (needs --save-every)");
  t->add_option("--trace", train.trace, "Write a Chrome-trace JSON of the run (one track per rank; open in Perfetto)");
  t->add_option("--save-every", train.save_every, "Sharded resumable checkpoint every N steps (checkpoint.save_every)")
      ->check(at_least(0));
  t->add_option("--precision", train.precision, "fp32, bf16 or fp16 (train.precision; fp16 turns on dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  t->add_option("--device", train.device, "cpu or cuda (train.device; cuda: one GPU in bf16, a -DLOOM_CUDA=ON build)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  t->add_option("--resume", train.resume, "auto (newest checkpoint in checkpoint.dir that loads, if any) or a checkpoint directory");
  t->add_flag("--overwrite", train.overwrite, "Start fresh in a checkpoint.dir holding an earlier run: move its "
                                              "checkpoints into checkpoint.dir/replaced-<time>/ (nothing is deleted); "
                                              "let --trace replace a file that is not an earlier trace of loom's");
  t->footer(config_keys_footer());
  cmds.push_back({t, [&a, argc, argv] { return loom::cli::run_train(a.train, argc, argv); }});

  loom::cli::VerifyArgs& ver = a.verify;
  auto* v = app.add_subcommand("verify", "Train parallel layouts and compare each with the single-process run");
  v->add_option("--configs", ver.configs, "Layouts: \"dp=2;dp=2,zero=1;dp=4\" or a file with one per line")->required();
  v->add_option("--config", ver.config_path, "TOML config for the model and run");
  v->add_option("--set", ver.sets, "Override one config key (repeatable)")->take_all();
  v->add_option("--steps", ver.steps, "Steps per run")->capture_default_str()->check(at_least(1));
  v->add_flag("--json", ver.json, "One JSON object per layout");
  cmds.push_back({v, [&a] { return loom::cli::run_verify(a.verify); }});
}

void add_sim_commands(CLI::App& app, Args& a, std::vector<Command>& cmds) {
  auto* sm = app.add_subcommand("simulate", "Predict step time, MFU/HFU, bubble and per-rank memory of a layout on a cluster");
  add_sim_flags(sm, a.sim);
  sm->add_option("--trace", a.sim.trace, "Write the simulated step as a Chrome trace (the engine's schema)");
  sm->add_flag("--ops", a.sim.ops, "Also print what the cost model charges each op of a block, the embedding and the "
                                   "head per micro-batch (forward, backward), to set beside LOOM_KERNEL_PROFILE");
  sm->add_option("--svg", a.sim.svg, "Write the simulated step as an SVG timeline");
  sm->add_option("--shrink-nodes", a.sim.shrink_nodes,
                 "Also price the layout an --elastic job re-forms to after losing this many nodes (dp shrunk, "
                 "accumulation raised: Note [Elastic shapes])")
      ->check(at_least(1));
  sm->add_flag("--overwrite", a.sim.overwrite, "Let --trace/--svg replace an existing file that is not an earlier "
                                               "output of loom's");
  cmds.push_back({sm, [&a] { return loom::cli::run_simulate(a.sim); }});

  auto* pc = app.add_subcommand("plan", "Search dp/tp/pp/vpp, micro-batch, ZeRO, sp, recompute and schedule for the fastest layout that fits");
  add_sim_flags(pc, a.plan.sim);
  pc->add_option("--top", a.plan.top, "Plans to print, fastest first (--cp N searches context parallel 1, 2, 4 .. N)")
      ->capture_default_str();
  pc->add_option("--ps", a.plan.ps,
                 "Also try parameter-server layouts (1, 2, 4 .. servers taking GPUs, the rest dp workers, ps.mode sync): "
                 "dense, or sparse (a Llama's embedding rows, Note [Sparse embeddings])");
  pc->add_flag("--explain", a.plan.explain,
               "Say why #1 beats #2: their step-time terms side by side, memory, and whether the gap is inside the "
               "simulator's expected error (Note [Plan explanation])");
  pc->add_option("--emit", a.plan.emit, "loom (a config for loom train --plan) | megatron (Megatron-LM arguments) for the best plan");
  pc->add_option("--out", a.plan.out, "Write --emit output to this file");
  pc->add_flag("--overwrite", a.plan.sim.overwrite, "Let --out replace an existing file that is not an earlier plan");
  pc->add_option("--compress", a.plan.compress,
                 "Gradient compressors to try: auto (loom's engine: topk, terngrad, powersgd, onebit_adam, "
                 "zero_one_adam and ZeRO++ where dp crosses nodes), none, or a list tried on every dp group, e.g. "
                 "powersgd,topk,zeropp")
      ->capture_default_str();
  cmds.push_back({pc, [&a] { return loom::cli::run_plan(a.plan); }});

  loom::cli::CalibrateArgs& cal = a.calibrate;
  auto* ca = app.add_subcommand("calibrate", "Measure this machine's kernels and collectives into the `local` cluster spec");
  ca->add_option("--out", cal.out, "Where to write it (default: ~/.cache/loom/cluster-local.toml, -bf16 for bf16)");
  ca->add_option("--precision", cal.precision, "bf16: time loom's bf16 GEMMs into the `local-bf16` spec")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16"}));
  ca->add_option("--threads", cal.threads, "Threads for the kernel timings (default: all cores)")
      ->check(at_least(0));
  ca->add_option("--ranks", cal.ranks, "Rank counts to time collectives at")->delimiter(',')->capture_default_str();
  ca->add_option("--passes", cal.passes, "Times each kernel table is measured, interleaved; each rate keeps its fastest pass (the VM's drift is slowdowns), each backward ratio the median")
      ->capture_default_str()->check(at_least(1, 15));
  ca->add_option("--offload-dir", cal.offload_dir,
                 "Directory whose disk offload files would use: its O_DIRECT rates become the [offload] tier ('' : none)")
      ->capture_default_str();
  cmds.push_back({ca, [&a] { return loom::cli::run_calibrate(a.calibrate); }});

  auto* cm = app.add_subcommand("compare", "Line up a predicted (loom simulate --trace) and a measured (loom train --trace) trace");
  cm->add_option("PREDICTED", a.cmp_pred, "Trace from loom simulate --trace")->required();
  cm->add_option("MEASURED", a.cmp_meas, "Trace from loom train --trace")->required();
  cm->add_flag("--json", a.cmp_json, "One JSON array of {rank, category, predicted, measured, unit, error}");
  cmds.push_back({cm, [&a] { return loom::cli::run_compare(a.cmp_pred, a.cmp_meas, a.cmp_json); }});
}

void add_checkpoint_commands(CLI::App& app, Args& a, std::vector<Command>& cmds) {
  auto* ck = app.add_subcommand("ckpt", "Checkpoint tools");
  ck->require_subcommand(1);
  auto* cki = ck->add_subcommand("inspect", "Print a sharded checkpoint's manifest");
  cki->add_option("DIR", a.ck_dir, "checkpoint.dir or one step-N directory")->required();
  cki->add_flag("--verify", a.ck_verify, "Read every piece and check its CRC-32");
  cmds.push_back({cki, [&a] { return loom::cli::run_ckpt_inspect(a.ck_dir, a.ck_verify); }});
  auto* ckc = ck->add_subcommand("convert", "Reshard a sharded checkpoint into another layout, offline");
  ckc->add_option("--in", a.cv_in, "checkpoint.dir or one step-N directory")->required();
  ckc->add_option("--out", a.cv_out, "Directory to write step-N (and latest) into")->required();
  add_layout_flags(ckc, a.cv_layout);
  ckc->add_option("--set", a.cv_sets, "Layout override parallel.key=value (repeatable), e.g. parallel.vocab_parallel=false")
      ->take_all();
  cmds.push_back({ckc, [&a] {
                    for (auto& x : a.cv_layout.as_sets()) a.cv_sets.push_back(x);
                    return loom::cli::run_ckpt_convert(a.cv_in, a.cv_out, a.cv_sets);
                  }});

  loom::cli::SampleArgs& smp = a.sample;
  auto* s = app.add_subcommand("sample", "Generate text from a checkpoint (with the tokenizer it was trained with)");
  s->add_option("--checkpoint", smp.checkpoint, "Checkpoint directory")->required();
  s->add_option("--prompt", smp.prompt, "Text to continue");
  s->add_option("--tokens", smp.tokens, "Tokens to generate")->capture_default_str()->check(at_least(0));
  s->add_option("--temperature", smp.temperature, "Sampling temperature; 0 is greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  s->add_option("--seed", smp.seed, "Sampling seed")->capture_default_str();
  s->add_option("--tokenizer", smp.tokenizer, "Tokenizer (default: the checkpoint's data.tokenizer, else byte)");
  s->add_flag("--logits", smp.logits, "Print each step's next-token logits as JSON lines instead of the text");
  cmds.push_back({s, [&a] { return loom::cli::run_sample(a.sample); }});
}

void add_interop_commands(CLI::App& app, Args& a, std::vector<Command>& cmds) {
  auto* e = app.add_subcommand("export", "Write a checkpoint as a Hugging Face model directory or safetensors file");
  e->add_option("--checkpoint", a.ex_ck, "Checkpoint directory")->required();
  e->add_option("--format", a.ex_fmt, "hf: a model directory; safetensors: one file; auto: one file when --out ends "
                                      "in .safetensors")->capture_default_str();
  e->add_option("--out", a.ex_out, "Output: a .safetensors file, or else a Hugging Face model directory (config.json, "
                                   "weights, tokenizer)")->required();
  e->add_option("--max-shard-mb", a.ex_shard_mb, "Model directory: weights in shards of at most this many MiB, with "
                                                 "an index")->capture_default_str();
  e->add_flag("--overwrite", a.ex_overwrite, "Replace --out even when it is not an earlier export of loom's");
  e->add_option("--dtype", a.ex_dtype, "fp32 (the masters as they are) or bf16 (rounded to nearest-even)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16"}));
  cmds.push_back({e, [&a] { return loom::cli::run_export(a.ex_ck, a.ex_fmt, a.ex_out, a.ex_dtype, a.ex_overwrite,
                                                                 a.ex_shard_mb); }});

  auto* im = app.add_subcommand("import", "Make a checkpoint from a Hugging Face model directory or safetensors file");
  im->add_option("--in", a.im_in, "Input: a safetensors file, or a Hugging Face model directory (config.json, "
                                 "model.safetensors or shards with their index, the tokenizer)")->required();
  im->add_option("--format", a.im_fmt, "hf (a model directory), safetensors (one file) or auto (what --in is)")
      ->capture_default_str();
  im->add_option("--checkpoint", a.im_ck, "Checkpoint directory to write")->required();
  im->add_option("--config", a.im_cfg, "TOML config for files without loom metadata (e.g. model.heads)");
  im->add_option("--set", a.im_sets, "Config override section.key=value (repeatable)")->take_all();
  im->add_option("--tokenizer", a.im_tok, "The model's tokenizer (tokenizer.json, vocab.json + merges.txt, .model): "
                                          "loom sample decodes with it");
  cmds.push_back({im, [&a] { return loom::cli::run_import(a.im_fmt, a.im_in, a.im_ck, a.im_cfg, a.im_sets, a.im_tok); }});
}

void add_plot_command(CLI::App& app, Args& a, std::vector<Command>& cmds) {
  auto* p = app.add_subcommand("plot", "Draw training curves of runs (their `loom train --json` or --csv output) as SVG or PNG");
  p->add_option("runs", a.plot_runs, "Logs of `loom train --json` or `--csv` (one or more)")->required();
  p->add_option("--out", a.plot_out, "The FILE.svg or FILE.png to write (PNG: rendered by rsvg-convert)")->required();
  p->add_option("--metrics", a.plot_metrics, "Comma-separated metrics, one panel each")->capture_default_str();
  p->add_flag("--overwrite", a.plot_overwrite, "Replace --out even when it is not an earlier plot of loom's");
  cmds.push_back({p, [&a] { return loom::cli::run_plot(a.plot_runs, a.plot_out, a.plot_metrics, a.plot_overwrite); }});
}

void add_bench_commands(CLI::App& app, Args& a, std::vector<Command>& cmds) {
  loom::cli::BenchCommArgs& bc = a.bench;
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto* bcomm = bench->add_subcommand("comm", "Collective sweep (nccl-tests style); run under mpirun -np N");
  bcomm->add_option("--op", bc.op, "all_reduce | reduce_scatter | all_gather | broadcast | all_to_all | all")
      ->capture_default_str();
  bcomm->add_option("--algorithm", bc.algorithm, "auto | shm | hierarchical | ring | recursive | native | mpi | ring+bf16 | ring+int8 | all (comma list)")
      ->capture_default_str();
  bcomm->add_option("--sizes", bc.sizes, "bytes with K/M/G suffixes and optional +N, e.g. 4K,1M,7M+13")
      ->capture_default_str();
  bcomm->add_option("--dtype", bc.dtype, "f32 | bf16")->capture_default_str();
  bcomm->add_option("--iters", bc.iters, "timed iterations per row; 0 = about 0.3 s worth (at least 5)")
      ->capture_default_str()
      ->check(at_least(0));
  bcomm->add_option("--threads", bc.threads, "run N ranks as threads of this process instead of under MPI")
      ->check(at_least(0));
  bcomm->add_flag("--json", bc.json, "one JSON object per row: op, algorithm, bytes, ranks, time_us, algbw_gbps, "
                                     "busbw_gbps, correct");
  bcomm->add_option("--config", bc.config_path, "TOML config (only [comm] matters here)");
  bcomm->add_option("--set", bc.sets, "Config override, e.g. comm.timeout_s=30 (repeatable)")->take_all();
  cmds.push_back({bcomm, [&a] { return loom::cli::run_bench_comm(a.bench); }});
}

}  // namespace

int main(int argc, char** argv) {
  loom::reexec_for_passive_omp_wait(argv);  // Note [OpenMP wait policy]
  CLI::App app{"loom: train transformer models (GPT-2, Llama) and plan their parallel training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  Args a;
  std::vector<Command> cmds;
  add_train_commands(app, a, cmds, argc, argv);
  add_sim_commands(app, a, cmds);
  add_checkpoint_commands(app, a, cmds);
  add_interop_commands(app, a, cmds);
  add_bench_commands(app, a, cmds);
  add_plot_command(app, a, cmds);
  const auto tk_cmds = loom::cli::add_tokenizer_commands(app, a.tokenizer);
  const auto da_cmds = loom::cli::add_data_commands(app, a.data);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    const int code = app.exit(err);
    return code == 0 ? 0 : 2;
  }
  try {
    for (const Command& c : cmds)
      if (*c.app) return c.run();
    if (app.got_subcommand("tokenizer")) return loom::cli::run_tokenizer(tk_cmds, a.tokenizer);
    if (app.got_subcommand("data")) return loom::cli::run_data(da_cmds, a.data);
  } catch (const loom::Error& err) {
    print_error(err.what());
    return err.kind() == loom::Error::Kind::kConfig ? 2 : 1;
  } catch (const std::exception& err) {
    print_error(err.what());
    return 1;
  }
  return 2;
}
