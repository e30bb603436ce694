// Predicted (simulator, `local` cluster from `loom calibrate`) vs measured (loom's engine)
// step time and rank-0 peak memory for 20 layouts of configs A and B (40 rows; --only TEXT: the
// rows whose layout names TEXT); with a bf16 spec
// (`loom calibrate --precision bf16`), also train.precision = bf16 rows. The engine runs as
// users run it, one process per rank (`loom train --nproc`, MPI); --threads runs the ranks
// as threads of this process instead (the thread backend), where every madvise of ZeRO-2/3
// shoots down all the ranks' TLBs and their steps come out slower than as processes.
// --best-of N makes N passes over all the layouts and keeps each one's fastest median step:
// on a shared VM the noise is slowdowns from other tenants that last minutes (one layout
// measured 15 points apart in two runs), so the fastest of passes spread over the run is the
// machine's own speed.
//   build/release/loom calibrate --out /tmp/local.toml
//   build/release/loom calibrate --precision bf16 --out /tmp/local-bf16.toml
//   build/release/bench/sim_vs_engine /tmp/local.toml [steps] [/tmp/local-bf16.toml] [--threads] [--best-of N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/sim/calibrate.h"
#include "loom/sim/simulator.h"
#include "loom/sim/validation.h"
#include "loom/train/trainer.h"

namespace {

struct Measured {
  double step_s = 0, memory_bytes = 0;
};

Measured run_engine(const loom::Config& c) {
  std::vector<loom::TrainSummary> out(size_t(c.parallel.world()));
  std::ostringstream sink;
  loom::TrainOptions o;
  o.out = o.err = &sink;
  const auto errors = loom::comm::run_threads(int(c.parallel.world()), {}, [&](loom::comm::World& w) {
    out[size_t(w.global_rank())] = loom::train(c, o, w);
  });
  for (const auto& e : errors)
    if (!e.empty()) throw loom::Error("engine run failed: " + e);
  std::vector<double> steps(out[0].step_seconds.begin() + 1, out[0].step_seconds.end());  // first step warms up
  std::sort(steps.begin(), steps.end());
  Measured m;
  m.step_s = steps[steps.size() / 2];
  for (const auto& [name, bytes] : out[0].memory_peak_bytes) m.memory_bytes += double(bytes);
  return m;
}

// One process per rank through `loom train --nproc`: the median step (elapsed_s deltas of
// the --json lines, the first step left out) and rank 0's peak resident memory (its report
// line: params, grads, optimizer, activations, buffers in MiB).
Measured run_processes(const std::string& loom, const std::vector<std::string>& sets, int64_t world) {
  std::string cmd = loom + " train --json --nproc " + std::to_string(world) + " --set train.log_every=1";
  for (const auto& s : sets) cmd += " --set '" + s + "'";
  cmd += " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) throw loom::Error("cannot run " + cmd);
  std::vector<double> elapsed;
  Measured m;
  std::string all;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, f)) {
    const std::string line = buf;
    all += line;
    if (const size_t at = line.find("\"elapsed_s\":"); at != std::string::npos && line.find("tokens_per_s") != std::string::npos)
      elapsed.push_back(std::strtod(line.c_str() + at + 12, nullptr));
    if (line.rfind("memory (rank 0, peak resident MiB):", 0) == 0)
      for (const char* k : {" params ", " grads ", " optimizer ", " activations ", " buffers "})
        if (const size_t at = line.find(k); at != std::string::npos)
          m.memory_bytes += std::strtod(line.c_str() + at + std::strlen(k), nullptr) * double(1 << 20);
  }
  if (::pclose(f) != 0 || elapsed.size() < 3 || m.memory_bytes <= 0)
    throw loom::Error("engine run failed: " + cmd + "\n" + all.substr(all.size() > 2000 ? all.size() - 2000 : 0));
  std::vector<double> steps;
  for (size_t i = 2; i < elapsed.size(); i++) steps.push_back(elapsed[i] - elapsed[i - 1]);  // from step 2 on
  std::sort(steps.begin(), steps.end());
  m.step_s = steps[steps.size() / 2];
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

// The arguments with --threads and --best-of N taken out; *threads says whether --threads was given.
static std::vector<char*> positional(int argc, char** argv, bool* threads, int* best_of, const char** also,
                                     const char** only) {
  std::vector<char*> out;
  for (int i = 0; i < argc; i++) {
    if (std::strcmp(argv[i], "--threads") == 0) *threads = true;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) *only = argv[++i];
    else if (std::strcmp(argv[i], "--also") == 0 && i + 1 < argc) *also = argv[++i];
    else if (std::strcmp(argv[i], "--best-of") == 0 && i + 1 < argc) *best_of = std::max(1, std::atoi(argv[++i]));
    else out.push_back(argv[i]);
  }
  return out;
}

// The fp32 rows' layouts (each on configs A and B).
static std::vector<std::vector<std::string>> fp32_layouts() {
  return {
      {},
      {"parallel.recompute=full"},
      {"parallel.dp=2"},
      {"parallel.dp=2", "parallel.zero=1"},
      {"parallel.dp=2", "parallel.zero=2"},
      {"parallel.dp=2", "parallel.zero=3"},
      {"parallel.tp=2"},
      {"parallel.tp=2", "parallel.sp=true"},
      {"parallel.pp=2", "train.grad_accum=4"},
      {"parallel.dp=2", "parallel.tp=2"},
      // The capabilities since (issue 21 item 3): a zero-bubble schedule, ZB-V's two chunks
      // a rank, PipeDream-2BW (no flush), a compressed gradient sync, the optimizer state and
      // then the parameters offloaded to disk (the chunk manager), and bf16 optimizer moments
      // (ZeRO-1: the sharded state's memory).
      {"parallel.pp=2", "train.grad_accum=4", "parallel.schedule=zb-h1"},
      {"parallel.pp=2", "train.grad_accum=4", "parallel.schedule=zb-v", "parallel.vpp=2"},
      {"parallel.pp=2", "train.grad_accum=4", "parallel.schedule=2bw"},
      {"parallel.dp=2", "parallel.compress=powersgd", "parallel.compress_warmup_steps=0"},
      {"offload.optimizer=disk", "offload.dir=/var/tmp"},
      {"offload.params=disk", "offload.optimizer=disk", "offload.dir=/var/tmp"},
      {"parallel.dp=2", "parallel.zero=1", "optim.moments=bf16"},
      // Context parallelism in its three modes (issue 53).
      {"parallel.cp=2"},
      {"parallel.cp=2", "parallel.cp_mode=ring"},
      {"parallel.cp=2", "parallel.cp_mode=ulysses"},
  };
}

// One benchmark row: its engine settings, the simulator's prediction, its best measurement.
struct Row {
  int pass = 0;  // 0 fp32, 1 bf16
  const char* name = "";
  std::string label, family;
  std::vector<std::string> sets;
  loom::Config cfg;  // what the engine trains (the plan's copy holds cp as SimPlan::cp instead)
  int64_t world = 1;
  loom::sim::SimPlan plan;
  loom::sim::SimResult pred;
  double also_step_s = 0;  // --also: the other cluster file's prediction (fp32 rows)
  Measured best;
};

static Row make_row(int pass, const char* name, const std::vector<std::string>& model,
                    const std::vector<std::string>& layout, const char* spec, int steps) {
  Row r;
  r.pass = pass, r.name = name, r.sets = model;
  if (pass == 1) r.sets.push_back("train.precision=bf16");
  for (const char* s : {"train.batch=8", "train.val_batches=1", "train.val_every=0", "checkpoint.dir=", "optim.warmup_steps=1"})
    r.sets.push_back(s);
  r.sets.push_back("train.steps=" + std::to_string(steps));
  r.sets.insert(r.sets.end(), layout.begin(), layout.end());
  // Each rank gets its share of the cores, as the `local` cluster's shared device assumes.
  r.world = loom::load_config("", r.sets).parallel.world();
  const int64_t cores = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  r.sets.push_back("train.threads=" + std::to_string(std::max<int64_t>(1, cores / r.world)));
  r.plan.framework = loom::sim::Framework::kLoom;
  r.cfg = r.plan.cfg = loom::load_config("", r.sets);
  loom::sim::take_context_parallel(r.plan);
  const loom::sim::ClusterSpec cluster = loom::sim::load_cluster(spec, {}, r.plan.gpus(), spec);
  r.pred = loom::sim::simulate(r.plan, cluster);
  r.family = loom::sim::device_family(cluster.device.name);
  r.label = pass == 1 ? "bf16 " : "";
  for (const auto& s : layout) r.label += s.substr(s.find('.') + 1) + " ";
  if (layout.empty()) r.label += "single";
  return r;
}

// Every row on configs A and B (fp32 layouts, then the bf16 ones when bf16_spec is given),
// less those whose label does not name `only`.
static std::vector<Row> make_rows(const char* spec, const char* bf16_spec, int steps, const char* only) {
  // Config A: GPT 4 x 256 (~3.4M params), B: GPT 8 x 256; sequences of 128, batch 8.
  const std::vector<std::pair<const char*, std::vector<std::string>>> models = {
      {"A", {"model.layers=4", "model.d_model=256", "model.heads=8", "model.ffn=1024", "model.ctx=128"}},
      {"B", {"model.layers=8", "model.d_model=256", "model.heads=8", "model.ffn=1024", "model.ctx=128"}}};
  const std::vector<std::vector<std::string>> layouts = fp32_layouts();
  // bf16 rows: the layouts whose GEMM split differs (whole, dp, tp, pp).
  const std::vector<std::vector<std::string>> bf16_layouts = {
      {}, {"parallel.dp=2"}, {"parallel.tp=2"}, {"parallel.pp=2", "train.grad_accum=4"}};
  std::vector<Row> rows;
  for (int pass = 0; pass < (bf16_spec ? 2 : 1); pass++)
    for (const auto& [name, model] : models)
      for (const auto& layout : pass == 0 ? layouts : bf16_layouts) {
        Row r = make_row(pass, name, model, layout, pass == 0 ? spec : bf16_spec, steps);
        if (!only || r.label.find(only) != std::string::npos) rows.push_back(std::move(r));
      }
  return rows;
}

// The medians, and each pass's step-time errors written beside its cluster file (Note [Error
// bands]: `loom plan`'s bands on that cluster).
static void report(const std::vector<double>& time_errs, const std::vector<double>& mem_errs,
                   const std::vector<double>& bf16_time_errs, const std::vector<loom::sim::ValidationPoint> points[2],
                   const char* fp32_cluster, const char* bf16_cluster) {
  const bool with_bf16 = bf16_cluster != nullptr;
  std::printf("configs %zu  median |step time error| %.1f%%  median |memory error| %.2f%%\n", time_errs.size(),
              100 * median(time_errs), 100 * median(mem_errs));
  if (with_bf16)
    std::printf("bf16 configs %zu  median |step time error| %.1f%%\n", bf16_time_errs.size(),
                100 * median(bf16_time_errs));
  // Beside each cluster file, for `loom plan`'s error bands on it.
  for (int pass = 0; pass < (with_bf16 ? 2 : 1); pass++) {
    const std::string path = loom::sim::validation_path_for(pass == 0 ? fp32_cluster : bf16_cluster);
    loom::sim::write_engine_points(path, points[pass], loom::sim::calibration_stamp(pass == 0 ? fp32_cluster : bf16_cluster));
    std::printf("wrote %zu step-time errors to %s (loom plan's error bands)\n", points[pass].size(), path.c_str());
  }
}

int main(int argc_in, char** argv_in) {
  bool threads = false;
  int best_of = 1;
  const char* also = nullptr;  // --also OTHER.toml: a second calibration scored on the same runs
  const char* only = nullptr;  // --only TEXT: the rows whose layout names TEXT (e.g. cp=)
  std::vector<char*> args = positional(argc_in, argv_in, &threads, &best_of, &also, &only);
  const int argc = int(args.size());
  char** argv = args.data();
  if (argc < 2) {
    std::fprintf(stderr, "usage: sim_vs_engine LOCAL_CLUSTER.toml [steps] [LOCAL_BF16_CLUSTER.toml] [--threads] "
                         "[--best-of N] [--also OTHER_CLUSTER.toml] [--only TEXT]\n");
    return 2;
  }
  const std::string loom_bin = std::string(argv[0]).substr(0, std::string(argv[0]).rfind('/') + 1) + "../loom";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 6;
  try {
    const bool with_bf16 = argc > 3;
    std::vector<Row> rows = make_rows(argv[1], with_bf16 ? argv[3] : nullptr, steps, only);
    for (Row& r : rows)
      if (also && r.pass == 0)
        r.also_step_s = loom::sim::simulate(r.plan, loom::sim::load_cluster(also, {}, r.plan.gpus(), also)).step_time_s;
    // --best-of N: N passes over all the rows, each row keeping its fastest: a slow spell of
    // the VM (minutes long) then lands on different rows in each pass. Before each pass and
    // after the last, the machine's speed against the calibration's (Note [Machine speed]).
    const loom::sim::DeviceSpec cal = loom::sim::load_cluster(argv[1], {}, 1, argv[1]).device;
    std::vector<double> speeds;
    for (int rep = 0; rep <= best_of; rep++) {
      if (cal.speed_probe_flops > 0) {
        speeds.push_back(loom::speed_probe_flops(int(std::max<int64_t>(1, cal.threads))) / cal.speed_probe_flops);
        std::printf("machine speed before %s: %.3f of the calibration's\n",
                    rep < best_of ? ("pass " + std::to_string(rep + 1)).c_str() : "the end", speeds.back());
        std::fflush(stdout);
      }
      if (rep == best_of) break;
      for (Row& r : rows) {
        const Measured m = threads ? run_engine(r.cfg) : run_processes(loom_bin, r.sets, r.world);
        if (rep == 0 || m.step_s < r.best.step_s) r.best = m;
      }
    }
    std::vector<double> time_errs, mem_errs, bf16_time_errs, also_errs;
    std::vector<loom::sim::ValidationPoint> points[2];  // Note [Error bands]: fp32, bf16
    std::printf("%-3s %-40s %12s %12s %8s %12s %12s %8s\n", "cfg", "layout", "pred step s", "meas step s", "error",
                "pred MiB", "meas MiB", "error");
    for (const Row& r : rows) {
      const double pred = r.pred.step_time_s, meas = r.best.step_s, pm = r.pred.ranks[0].memory.total();
      (r.pass == 0 ? time_errs : bf16_time_errs).push_back(std::fabs(pred / meas - 1));
      points[r.pass].push_back({loom::sim::layout_kind(r.plan), r.family, pred / meas - 1});
      mem_errs.push_back(std::fabs(pm / r.best.memory_bytes - 1));
      std::printf("%-3s %-40s %12.4f %12.4f %+7.1f%% %12.2f %12.2f %+7.2f%%", r.name, r.label.c_str(), pred, meas,
                  100 * (pred / meas - 1), pm / (1 << 20), r.best.memory_bytes / (1 << 20), 100 * (pm / r.best.memory_bytes - 1));
      if (r.also_step_s > 0) {
        also_errs.push_back(std::fabs(r.also_step_s / meas - 1));
        std::printf("   --also %.4f %+7.1f%%", r.also_step_s, 100 * (r.also_step_s / meas - 1));
      }
      std::printf("\n");
    }
    if (also) std::printf("--also %s: median |step time error| %.1f%%\n", also, 100 * median(also_errs));
    report(time_errs, mem_errs, bf16_time_errs, points, argv[1], with_bf16 ? argv[3] : nullptr);
    if (!speeds.empty())
      std::printf("machine speed against the calibration over the run: %.3f to %.3f\n",
                  *std::min_element(speeds.begin(), speeds.end()), *std::max_element(speeds.begin(), speeds.end()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_vs_engine: %s\n", e.what());
    return 1;
  }
  return 0;
}
