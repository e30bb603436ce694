// loom command line. Exit codes: 0 success, 2 usage or config error, 1 runtime failure.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdlib>
#include <iostream>

#include "loom/cli/commands.h"
#include "loom/core/config.h"
#include "loom/core/error.h"

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
  app->add_option("--schedule", f.schedule, "gpipe | 1f1b | interleaved (parallel.schedule)");
  app->add_option("--recompute", f.recompute, "none | selective | full (parallel.recompute)");
  app->add_option("--pp-layers", f.pp_layers, "layers per stage, e.g. 3,4 (parallel.pp_layers)");
}

void add_sim_flags(CLI::App* app, loom::cli::SimArgs& a) {
  app->add_option("--model", a.model, "Model preset (see loom train --help), or custom with --set model.*");
  app->add_option("--config", a.config_path, "TOML config for the model and run");
  app->add_option("--set", a.sets, "Override a key: model.*, train.*, parallel.*, cluster.* (repeatable)")->take_all();
  app->add_option("--cluster", a.cluster, "dgx-a100 | dgx-h100 | local (from loom calibrate) | local-bf16 (calibrate --precision bf16) | FILE.toml")
      ->capture_default_str();
  app->add_option("--gpus", a.gpus, "Devices: sets the node count; --dp defaults to gpus / (tp x pp x cp)")
      ->check(at_least(1));
  app->add_option("--global-batch", a.global_batch, "Sequences per optimizer step (train.batch)")
      ->check(at_least(1));
  app->add_option("--seq", a.seq, "Tokens per sequence (train.seq; default model.ctx)")->check(at_least(1));
  app->add_option("--cp", a.cp, "Context-parallel degree (modelled; the engine runs cp = 1)")->capture_default_str();
  app->add_flag("--json", a.json, "One JSON object per result (step_time_s, tokens_per_s, tflops_per_gpu, mfu, hfu, "
                                  "bubble_fraction, peak_memory_bytes, breakdown, memory per rank)");
  app->add_option("--framework", a.framework, "loom | megatron: whose activations, dropout and precision to model "
                                              "(default: loom on a calibrated CPU cluster, megatron on GPU presets)");
  app->add_flag("--flash-attention", a.flash_attention, "Megatron with flash attention: causal-only attention "
                                                        "FLOPs, no (s, s) scores kept (the published runs had none)");
  app->add_option("--dp-overlap", a.dp_overlap, "on | off: data-parallel gradient reduction overlapped with "
                                                "backward (Megatron-core --overlap-grad-reduce, torch DDP: on; "
                                                "Megatron-LM's 2021-22 local DDP: off). Default on")
      ->check(CLI::IsMember({"on", "off"}));
  app->add_flag("--blocking-p2p", a.blocking_p2p, "Pipeline sends hold the sending rank until delivered "
                                                  "(Megatron-LM's batched isend/irecv + wait); default asynchronous");
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom: train transformer models (GPT-2, Llama) and plan their parallel training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");

  loom::cli::TrainArgs train;
  auto* t = app.add_subcommand("train", "Train a model on a text corpus and save a checkpoint");
  t->add_option("--config,--plan", train.config_path, "TOML config file (sections model, data, train, optim, checkpoint, comm, parallel); a plan from loom plan --emit loom is one");
  t->add_option("--set", train.sets, "Override one config key: section.key=value (repeatable)")->take_all();
  t->add_flag("--json", train.json, "Print one JSON object per line (step, loss, tokens_per_s; val lines add val_loss)");
  add_layout_flags(t, train.layout);
  t->add_option("--nproc", train.nproc, "Run the layout's ranks here: relaunches itself under mpirun -np N")
      ->check(at_least(1));
  t->add_option("--trace", train.trace, "Write a Chrome-trace JSON of the run (one track per rank; open in Perfetto)");
  t->add_option("--save-every", train.save_every, "Sharded resumable checkpoint every N steps (checkpoint.save_every)")
      ->check(at_least(0));
  t->add_option("--precision", train.precision, "fp32, bf16 or fp16 (train.precision; fp16 turns on dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  t->add_option("--resume", train.resume, "auto (newest checkpoint in checkpoint.dir that loads, if any) or a checkpoint directory");
  t->add_flag("--overwrite", train.overwrite, "Start fresh in a checkpoint.dir holding an earlier run: move its "
                                              "checkpoints into checkpoint.dir/replaced-<time>/ (nothing is deleted)");
  t->footer(config_keys_footer());

  loom::cli::VerifyArgs ver;
  auto* v = app.add_subcommand("verify", "Train parallel layouts and compare each with the single-process run");
  v->add_option("--configs", ver.configs, "Layouts: \"dp=2;dp=2,zero=1;dp=4\" or a file with one per line")->required();
  v->add_option("--config", ver.config_path, "TOML config for the model and run");
  v->add_option("--set", ver.sets, "Override one config key (repeatable)")->take_all();
  v->add_option("--steps", ver.steps, "Steps per run")->capture_default_str()->check(at_least(1));
  v->add_flag("--json", ver.json, "One JSON object per layout");

  loom::cli::SimArgs sim;
  auto* sm = app.add_subcommand("simulate", "Predict step time, MFU/HFU, bubble and per-rank memory of a layout on a cluster");
  add_sim_flags(sm, sim);
  sm->add_option("--trace", sim.trace, "Write the simulated step as a Chrome trace (the engine's schema)");
  sm->add_option("--svg", sim.svg, "Write the simulated step as an SVG timeline");

  loom::cli::PlanArgs pl;
  auto* pc = app.add_subcommand("plan", "Search dp/tp/pp/vpp, micro-batch, ZeRO, sp, recompute and schedule for the fastest layout that fits");
  add_sim_flags(pc, pl.sim);
  pc->add_option("--top", pl.top, "Plans to print, fastest first (--cp N searches context parallel 1, 2, 4 .. N)")
      ->capture_default_str();
  pc->add_option("--emit", pl.emit, "loom (a config for loom train --plan) | megatron (Megatron-LM arguments) for the best plan");
  pc->add_option("--out", pl.out, "Write --emit output to this file");

  loom::cli::CalibrateArgs cal;
  auto* ca = app.add_subcommand("calibrate", "Measure this machine's kernels and collectives into the `local` cluster spec");
  ca->add_option("--out", cal.out, "Where to write it (default: ~/.cache/loom/cluster-local.toml, -bf16 for bf16)");
  ca->add_option("--precision", cal.precision, "bf16: time loom's bf16 GEMMs into the `local-bf16` spec")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16"}));
  ca->add_option("--threads", cal.threads, "Threads for the kernel timings (default: all cores)")
      ->check(at_least(0));
  ca->add_option("--ranks", cal.ranks, "Rank counts to time collectives at")->delimiter(',')->capture_default_str();

  std::string cmp_pred, cmp_meas;
  bool cmp_json = false;
  auto* cm = app.add_subcommand("compare", "Line up a predicted (loom simulate --trace) and a measured (loom train --trace) trace");
  cm->add_option("PREDICTED", cmp_pred, "Trace from loom simulate --trace")->required();
  cm->add_option("MEASURED", cmp_meas, "Trace from loom train --trace")->required();
  cm->add_flag("--json", cmp_json, "One JSON array of {rank, category, predicted, measured, unit, error}");

  std::string ck_dir;
  auto* ck = app.add_subcommand("ckpt", "Checkpoint tools");
  ck->require_subcommand(1);
  auto* cki = ck->add_subcommand("inspect", "Print a sharded checkpoint's manifest");
  cki->add_option("DIR", ck_dir, "checkpoint.dir or one step-N directory")->required();
  bool ck_verify = false;
  cki->add_flag("--verify", ck_verify, "Read every piece and check its CRC-32");
  std::string cv_in, cv_out;
  std::vector<std::string> cv_sets;
  loom::cli::LayoutFlags cv_layout;
  auto* ckc = ck->add_subcommand("convert", "Reshard a sharded checkpoint into another layout, offline");
  ckc->add_option("--in", cv_in, "checkpoint.dir or one step-N directory")->required();
  ckc->add_option("--out", cv_out, "Directory to write step-N (and latest) into")->required();
  add_layout_flags(ckc, cv_layout);
  ckc->add_option("--set", cv_sets, "Layout override parallel.key=value (repeatable), e.g. parallel.vocab_parallel=false")
      ->take_all();

  loom::cli::SampleArgs smp;
  auto* s = app.add_subcommand("sample", "Generate text from a checkpoint (with the tokenizer it was trained with)");
  s->add_option("--checkpoint", smp.checkpoint, "Checkpoint directory")->required();
  s->add_option("--prompt", smp.prompt, "Text to continue");
  s->add_option("--tokens", smp.tokens, "Tokens to generate")->capture_default_str()->check(at_least(0));
  s->add_option("--temperature", smp.temperature, "Sampling temperature; 0 is greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  s->add_option("--seed", smp.seed, "Sampling seed")->capture_default_str();
  s->add_option("--tokenizer", smp.tokenizer, "Tokenizer (default: the checkpoint's data.tokenizer, else byte)");

  std::string ex_ck, ex_fmt = "safetensors", ex_out, ex_dtype = "fp32";
  auto* e = app.add_subcommand("export", "Write a checkpoint as Hugging Face-named safetensors");
  e->add_option("--checkpoint", ex_ck, "Checkpoint directory")->required();
  e->add_option("--format", ex_fmt, "Output format (safetensors)")->capture_default_str();
  e->add_option("--out", ex_out, "Output file")->required();
  e->add_option("--dtype", ex_dtype, "fp32 (the masters as they are) or bf16 (rounded to nearest-even)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16"}));

  std::string im_in, im_fmt = "safetensors", im_ck, im_cfg;
  std::vector<std::string> im_sets;
  auto* im = app.add_subcommand("import", "Make a checkpoint from Hugging Face-named safetensors");
  im->add_option("--in", im_in, "Input safetensors file")->required();
  im->add_option("--format", im_fmt, "Input format (safetensors)")->capture_default_str();
  im->add_option("--checkpoint", im_ck, "Checkpoint directory to write")->required();
  im->add_option("--config", im_cfg, "TOML config for files without loom metadata (e.g. model.heads)");
  im->add_option("--set", im_sets, "Config override section.key=value (repeatable)")->take_all();
  std::string im_tok;
  im->add_option("--tokenizer", im_tok, "The model's tokenizer (tokenizer.json, vocab.json + merges.txt, .model): "
                                        "loom sample decodes with it");

  loom::cli::BenchCommArgs bc;
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

  loom::cli::TokenizerArgs tk;
  const auto tk_cmds = loom::cli::add_tokenizer_commands(app, tk);
  loom::cli::DataArgs da;
  const auto da_cmds = loom::cli::add_data_commands(app, da);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    const int code = app.exit(err);
    return code == 0 ? 0 : 2;
  }
  try {
    if (*t) return loom::cli::run_train(train, argc, argv);
    if (*v) return loom::cli::run_verify(ver);
    if (*sm) return loom::cli::run_simulate(sim);
    if (*pc) return loom::cli::run_plan(pl);
    if (*ca) return loom::cli::run_calibrate(cal);
    if (*cm) return loom::cli::run_compare(cmp_pred, cmp_meas, cmp_json);
    if (*cki) return loom::cli::run_ckpt_inspect(ck_dir, ck_verify);
    if (*ckc) {
      for (auto& x : cv_layout.as_sets()) cv_sets.push_back(x);
      return loom::cli::run_ckpt_convert(cv_in, cv_out, cv_sets);
    }
    if (*s) return loom::cli::run_sample(smp);
    if (*e) return loom::cli::run_export(ex_ck, ex_fmt, ex_out, ex_dtype);
    if (*im) return loom::cli::run_import(im_fmt, im_in, im_ck, im_cfg, im_sets, im_tok);
    if (*bcomm) return loom::cli::run_bench_comm(bc);
    if (app.got_subcommand("tokenizer")) return loom::cli::run_tokenizer(tk_cmds, tk);
    if (app.got_subcommand("data")) return loom::cli::run_data(da_cmds, da);
  } catch (const loom::Error& err) {
    print_error(err.what());
    return err.kind() == loom::Error::Kind::kConfig ? 2 : 1;
  } catch (const std::exception& err) {
    print_error(err.what());
    return 1;
  }
  return 2;
}
