// Simulates every row of a published-runs CSV on its cluster preset and prints predicted
// vs published (TFLOP/s per GPU in Megatron's count, tokens/s per GPU or iteration time:
// Note [Published metrics]), the error per row and the median absolute error in the rows'
// metrics and in step time (issue 5's target: <= 10%); then the planner per row.
//   build/release/bench/sim_published [CSV] [--by-source] [--no-plan] [--row ID] [--plans ID,ID,...]
// --by-source: per source_id, then per parallelism category and per GPU, the rows, median and
// max |error| and the median signed error, all in step time (predicted / measured - 1:
// negative is predicted too fast; a rate's is published / predicted - 1), after the
// per-row table, whose error is in each row's own metric (issue 21's validation report);
// then two checks outside the CSV: SC'21's ZeRO-3 at scale and GLM-130B's speed test.
// --no-plan: skip the planner rows (about two minutes on the 90 handed-over rows).
// --row ID: one row's step-time breakdown and per-op costs instead (what its error is made of).
// --plans IDS: only the planner's rows, for those rows (e.g. the fp8 recipes of issue 57:
// loom plan at the row's precision against the published layout, both simulated).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "loom/plan/search.h"
#include "loom/sim/published.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

using Groups = std::map<std::string, std::vector<double>>;  // group -> signed errors

void print_groups(const char* title, const Groups& groups) {
  std::printf("%-36s %5s %14s %14s %16s\n", title, "rows", "median |error|", "max |error|", "median signed");
  for (const auto& [name, errs] : groups) {
    std::vector<double> abs_errs;
    for (double e : errs) abs_errs.push_back(std::fabs(e));
    std::printf("%-36s %5zu %13.1f%% %13.1f%% %+15.1f%%\n", name.substr(0, 36).c_str(), errs.size(),
                100 * median(abs_errs), 100 * *std::max_element(abs_errs.begin(), abs_errs.end()), 100 * median(errs));
  }
  std::printf("\n");
}

std::string field(const loom::sim::PublishedRun& row, const char* key) {
  const auto it = row.fields.find(key);
  return it == row.fields.end() || it->second.empty() ? "?" : it->second;
}

// Narayanan et al. (SC'21) Table 2: GPT-3 175B (vocab 51200), global batch 1536, ZeRO-3
// without model parallelism (DeepSpeed, fp16, full recompute) on n A100s at micro-batch
// 1536 / n, TFLOP/s per GPU in the paper's 96-form count. Not a handed-over row (the issue
// quotes their range, 44-144), so it is printed beside the table, not in its statistics.
// Then `loom plan` for 175B on 1,024 A100s under each framework (issue 21's target).
void print_zero3_at_scale() {
  struct Row {
    int64_t gpus;
    double tflops;
  };
  const Row rows[] = {{384, 144}, {768, 88}, {1536, 44}};
  const char* frameworks[] = {"fsdp", "deepspeed-2021"};
  std::printf("ZeRO-3 at scale: Narayanan et al. SC'21 Table 2, GPT-3 175B, global batch 1536 (TFLOP/s per GPU, 96-form)\n");
  std::printf("%6s %4s %10s | %-16s %10s %8s %10s\n", "gpus", "mb", "published", "framework", "predicted", "error",
              "zero s");
  for (const Row& r : rows)
    for (const char* fw : frameworks) {
      loom::sim::SimPlan p;
      p.framework = loom::sim::parse_framework(fw);
      p.cfg = loom::load_config("", {"model.preset=gpt3-175b", "model.vocab=51200", "train.batch=1536",
                                     "parallel.dp=" + std::to_string(r.gpus), "parallel.zero=3", "train.grad_accum=1",
                                     "parallel.micro_batch=" + std::to_string(1536 / r.gpus), "parallel.recompute=full"});
      const loom::sim::SimResult res = loom::sim::simulate(p, loom::sim::load_cluster("dgx-a100", {}, r.gpus, ""));
      const double F = loom::sim::megatron_flops_per_iteration(1536, 2048, 96, 12288, 51200, true);
      const double tflops = F / res.step_time_s / double(r.gpus) / 1e12;
      std::printf("%6lld %4lld %10.0f | %-16s %10.1f %+7.1f%% %10.2f\n", static_cast<long long>(r.gpus),
                  static_cast<long long>(1536 / r.gpus), r.tflops, fw, tflops, 100 * (tflops / r.tflops - 1),
                  res.breakdown.zero_comm);
    }
  std::printf("\nloom plan: GPT-3 175B on 1,024 A100s, global batch 1536 (model TFLOP/s per GPU, 72-form)\n");
  for (const char* fw : {"megatron", "fsdp", "deepspeed-2021"}) {
    loom::plan::PlanRequest req;
    req.like.framework = loom::sim::parse_framework(fw);
    req.like.cfg = loom::load_config("", {"model.preset=gpt3-175b", "model.vocab=51200", "train.batch=1536"});
    req.cluster = loom::sim::load_cluster("dgx-a100", {}, 1024, "");
    req.global_batch = 1536;
    req.top = 1;
    const loom::plan::PlanReport rep = loom::plan::search_plans(req);
    if (rep.ranked.empty()) {
      std::printf("  %-15s no plan fits\n", fw);
      continue;
    }
    const loom::plan::PlanCandidate& best = rep.ranked.front();
    std::printf("  %-15s %6.1f  %s\n", fw, best.result.tflops_per_gpu, loom::plan::layout_label(best.plan).c_str());
  }
  std::printf("\n");
}

// GLM-130B (Zeng et al. 2022; issue 57 names it about 30% too fast), not a handed-over row.
// The run's own sources fix its layout: LargeScale's configs/glm-130b/glm-130b.sh (the
// trainer GLM's log names: BigScience-style Megatron-DeepSpeed on DeepSpeed 0.6.1) sets tp 4,
// pp 8, micro-batch 1, global batch 4,224 (176 x 24), ZeRO-1, fp16, full recompute, and
// `--pp-partition-method 'type:transformer|embedding'`: 72 units, 9 a stage, so the stages
// holding the embedding and the tied head run 8 blocks. DeepSpeed's pipeline engine reduces
// the gradients after the flush (its TrainSchedule's ReduceGrads) and its sends block.
// The model: 70 layers of 12,288, 96 heads, GeGLU of 32,768 (three matrices: priced as a GELU
// MLP of 49,152, the same GEMM FLOPs), vocabulary 150,528, 2,048 tokens, layers with dropout
// and LayerNorm as GPT's. 96 DGX-A100 40 GB nodes. GLM-130B's logs/main-log-en.md measured
// two global batches: 88.5 s an iteration at 4,224 (its 134 TFLOP/s: the paper's HFU 43.3%)
// and 122.5 s at 6,144; their difference splits a step into a cost per micro-batch and a
// fixed part (bubble, gradient reduction, optimizer), printed beside the prediction's.
void print_glm130b() {
  struct Point {
    int64_t batch;
    double published_s;
    double predicted_s = 0;
  };
  Point pts[] = {{4224, 88.5}, {6144, 122.5}};
  const int64_t dp = 24;
  const loom::sim::ClusterSpec cluster = loom::sim::load_cluster(
      "dgx-a100", {"cluster.device.name=A100-SXM4-40GB", "cluster.device.memory_gib=40", "cluster.device.memory_gbps=1555"},
      768, "");
  std::printf("GLM-130B: its log's speed test on 96 DGX-A100 40 GB (tp 4 pp 8 dp 24, mb 1, ZeRO-1, full recompute)\n");
  std::printf("%7s %6s %10s %10s %8s %8s %8s\n", "batch", "mbs", "published", "predicted", "error", "bubble", "mem GiB");
  for (Point& p : pts) {
    loom::sim::SimPlan plan;
    plan.dp_overlap = false;   // DeepSpeed's ReduceGrads after the flush
    plan.blocking_p2p = true;  // its SendActivation / SendGrad block
    plan.cfg = loom::load_config(
        "", {"model.arch=gpt", "model.layers=70", "model.d_model=12288", "model.heads=96", "model.ffn=49152",
             "model.vocab=150528", "model.ctx=2048", "train.batch=" + std::to_string(p.batch),
             "train.grad_accum=" + std::to_string(p.batch / dp), "parallel.dp=24", "parallel.tp=4", "parallel.pp=8",
             "parallel.pp_layers=8,9,9,9,9,9,9,8", "parallel.zero=1", "parallel.micro_batch=1",
             "parallel.recompute=full"});
    const loom::sim::SimResult res = loom::sim::simulate(plan, cluster);
    p.predicted_s = res.step_time_s;
    std::printf("%7lld %6lld %9.1fs %9.1fs %+7.1f%% %7.1f%% %8.1f\n", static_cast<long long>(p.batch),
                static_cast<long long>(p.batch / dp), p.published_s, p.predicted_s,
                100 * (p.predicted_s / p.published_s - 1), 100 * res.bubble_fraction,
                res.peak_memory_bytes / double(1 << 30));
  }
  // t(m) = fixed + m x per_mb over m micro-batches a pipeline: two points give both.
  const double dm = double(pts[1].batch - pts[0].batch) / dp;
  const auto split = [&](double t0, double t1) {
    const double per_mb = (t1 - t0) / dm;
    return std::pair<double, double>{per_mb, t0 - per_mb * double(pts[0].batch / dp)};
  };
  const auto [pub_mb, pub_fixed] = split(pts[0].published_s, pts[1].published_s);
  const auto [pred_mb, pred_fixed] = split(pts[0].predicted_s, pts[1].predicted_s);
  std::printf("per micro-batch: published %.3f s, predicted %.3f s (%+.1f%%); fixed a step: published %.1f s, "
              "predicted %.1f s\n\n",
              pub_mb, pred_mb, 100 * (pred_mb / pub_mb - 1), pub_fixed, pred_fixed);
}

// One row: what its predicted step is made of (the slowest rank's breakdown) and each op's
// forward and backward cost per micro-batch, so an error can be traced to a term.
int explain_row(const std::string& path, const std::string& id) {
  for (const auto& row : loom::sim::read_published_runs(path)) {
    if (row.id() != id) continue;
    const loom::sim::PublishedCheck c = loom::sim::check_published(row);
    const loom::sim::Breakdown& b = c.result.breakdown;
    std::printf("row %s  %s\n%s published %.2f predicted %.2f (%+.1f%%)  step %.4f s  micro-batches %lld\n", c.id.c_str(),
                c.label.c_str(), c.metric.c_str(), c.published, c.predicted, 100 * c.error(), c.result.step_time_s,
                static_cast<long long>(c.result.micro_batches));
    std::printf("breakdown (s): compute %.4f recompute %.4f tp %.4f cp %.4f zero %.4f pp-idle %.4f dp-exposed %.4f "
                "optimizer %.4f param-fetch %.4f\n",
                b.compute, b.recompute, b.tp_comm, b.cp_comm, b.zero_comm, b.pp_idle, b.dp_exposed, b.optimizer,
                b.param_fetch);
    if (!c.assumed.empty()) std::printf("%s\n", c.assumed.c_str());
    const loom::sim::PublishedCase pc = loom::sim::published_case(row);
    std::printf("%-10s %-24s %12s %12s\n", "unit", "op", "fwd ms", "bwd ms");
    for (const loom::sim::OpCost& op : loom::sim::op_costs(pc.plan, pc.cluster))
      std::printf("%-10s %-24s %12.4f %12.4f\n", op.unit.c_str(), op.name.c_str(), 1e3 * op.fwd_s, 1e3 * op.bwd_s);
    return 0;
  }
  std::fprintf(stderr, "sim_published: no row %s in %s\n", id.c_str(), path.c_str());
  return 2;
}

// Each row predicted against its published figure, the median and max, and with `by_source`
// the per-source, per-category and per-GPU groups (issue 21's validation report).
void print_table(const std::string& path, bool by_source) {
  std::vector<double> errs, step_errs;
  Groups per_source, per_category, per_gpu;
  std::printf("%-4s %-52s %-17s %10s %10s %8s %6s %6s %6s %7s\n", "row", "configuration", "metric", "published",
              "predicted", "error", "mfu", "hfu", "bubble", "mem GiB");
  int skipped = 0;
  for (const auto& row : loom::sim::read_published_runs(path)) {
    loom::sim::PublishedCheck c;
    try {
      c = loom::sim::check_published(row);
    } catch (const std::exception& e) {  // a row the model cannot express: named, not guessed
      std::printf("%-4s skipped: %s\n", row.id().c_str(), e.what());
      ++skipped;
      continue;
    }
    errs.push_back(std::fabs(c.error()));
    const double step_err = c.step_time_error();  // groups compare in one sense
    step_errs.push_back(std::fabs(step_err));
    per_source[field(row, "source_id")].push_back(step_err);
    per_category[field(row, "parallelism_category")].push_back(step_err);
    per_gpu[row.gpu_family()].push_back(step_err);
    std::printf("%-4s %-52s %-17s %10.2f %10.2f %+7.1f%% %6.3f %6.3f %6.3f %7.1f\n", c.id.c_str(), c.label.c_str(),
                c.metric.c_str(), c.published, c.predicted, 100 * c.error(), c.result.mfu, c.result.hfu,
                c.result.bubble_fraction, c.result.peak_memory_bytes / double(1 << 30));
    if (!c.assumed.empty()) std::printf("     %s\n", c.assumed.c_str());
  }
  std::sort(errs.begin(), errs.end());
  std::printf("rows %zu (%d skipped)  median |error| %.1f%%  max |error| %.1f%%\n", errs.size(), skipped,
              100 * median(errs), errs.empty() ? 0.0 : 100 * errs.back());
  std::sort(step_errs.begin(), step_errs.end());
  std::printf("in step time: median |error| %.2f%%  max |error| %.1f%%\n\n", 100 * median(step_errs),
              step_errs.empty() ? 0.0 : 100 * step_errs.back());
  if (!by_source) return;
  print_groups("source", per_source);
  print_groups("parallelism category", per_category);
  print_groups("gpu", per_gpu);
  print_zero3_at_scale();
  print_glm130b();
}

// The planner on each row's model, GPU count, global batch and precision, against the
// published layout (rows in `only`, or all).
void print_plans(const std::string& path, const std::vector<std::string>& only = {}) {
  std::printf("%-4s %-14s %12s %12s %7s %9s %6s  %s\n", "row", "model", "published s", "planned s", "gain",
              "simulated", "time", "best plan");
  int not_worse = 0, rows = 0;
  for (const auto& row : loom::sim::read_published_runs(path)) {
    if (!only.empty() && std::find(only.begin(), only.end(), row.id()) == only.end()) continue;
    loom::sim::PublishedCase pc;
    try {
      pc = loom::sim::published_case(row);
    } catch (const std::exception& e) {  // skipped in the table too
      std::printf("%-4s skipped: %s\n", row.id().c_str(), e.what());
      continue;
    }
    const double published = loom::sim::simulate(pc.plan, pc.cluster).step_time_s;
    loom::plan::PlanRequest req;
    req.like = pc.plan;  // the published framework's own communication
    req.like.activation_offload_layers = 0;  // not a searched choice (Note [Activation offload])
    req.like.fp8_param_gather = false;
    req.cluster = pc.cluster;
    req.global_batch = pc.plan.cfg.train.batch;
    req.top = 1;
    if (pc.plan.cp > 1) req.cp = {1, pc.plan.cp};  // the row's context parallelism is on offer too
    const loom::plan::PlanReport rep = loom::plan::search_plans(req);
    ++rows;
    if (rep.ranked.empty()) {
      std::printf("%-4s no plan fits\n", row.id().c_str());
      continue;
    }
    const double planned = rep.ranked.front().result.step_time_s;
    not_worse += planned <= published * (1 + 1e-9);
    std::printf("%-4s %-14s %12.3f %12.3f %6.1f%% %9lld %5.2fs  %s\n", row.id().c_str(), row.fields.at("model").c_str(),
                published, planned, 100 * (published / planned - 1), static_cast<long long>(rep.evaluated), rep.total_s,
                loom::plan::layout_label(rep.ranked.front().plan).substr(0, 90).c_str());
    std::fflush(stdout);
  }
  std::printf("planner at least as fast as the published layout (predicted) on %d of %d rows\n", not_worse, rows);
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = LOOM_SOURCE_DIR "/tests/reference/published_runs.csv";
  bool by_source = false, plan = true;
  std::string row_id;
  std::vector<std::string> plan_rows;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--by-source")) by_source = true;
    else if (!std::strcmp(argv[i], "--row") && i + 1 < argc) row_id = argv[++i];
    else if (!std::strcmp(argv[i], "--row")) return std::fprintf(stderr, "sim_published: --row needs a row id\n"), 2;
    else if (!std::strcmp(argv[i], "--no-plan")) plan = false;
    else if (!std::strcmp(argv[i], "--plans") && i + 1 < argc)
      for (std::string ids = argv[++i], id; !ids.empty(); ids = ids.find(',') == std::string::npos ? "" : ids.substr(ids.find(',') + 1))
        plan_rows.push_back(ids.substr(0, ids.find(',')));
    else if (!std::strcmp(argv[i], "--plans")) return std::fprintf(stderr, "sim_published: --plans needs row ids\n"), 2;
    else if (argv[i][0] == '-') return std::fprintf(stderr, "sim_published: unknown option %s\n", argv[i]), 2;
    else path = argv[i];
  }
  try {
    if (!row_id.empty()) return explain_row(path, row_id);
    if (!plan_rows.empty()) return print_plans(path, plan_rows), 0;
    print_table(path, by_source);
    if (plan) print_plans(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_published: %s\n", e.what());
    return 1;
  }
  return 0;
}
