// Simulates every row of a published-runs CSV on its cluster preset and prints predicted
// vs published (TFLOP/s per GPU in Megatron's count, or iteration time), the error per
// row and the median absolute error (issue 5's target: <= 10%).
//   build/release/bench/sim_published [tests/reference/published_runs.csv]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include "loom/plan/search.h"
#include "loom/sim/published.h"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : LOOM_SOURCE_DIR "/tests/reference/published_runs.csv";
  try {
    std::vector<double> errs;
    std::printf("%-4s %-52s %-17s %10s %10s %8s %6s %6s %6s %7s\n", "row", "configuration", "metric", "published",
                "predicted", "error", "mfu", "hfu", "bubble", "mem GiB");
    for (const auto& row : loom::sim::read_published_runs(path)) {
      const loom::sim::PublishedCheck c = loom::sim::check_published(row);
      errs.push_back(std::fabs(c.error()));
      std::printf("%-4s %-52s %-17s %10.2f %10.2f %+7.1f%% %6.3f %6.3f %6.3f %7.1f\n", c.id.c_str(), c.label.c_str(),
                  c.metric.c_str(), c.published, c.predicted, 100 * c.error(), c.result.mfu, c.result.hfu,
                  c.result.bubble_fraction, c.result.peak_memory_bytes / double(1 << 30));
    }
    std::sort(errs.begin(), errs.end());
    const size_t n = errs.size();
    const double median = n % 2 ? errs[n / 2] : (errs[n / 2 - 1] + errs[n / 2]) / 2;
    std::printf("rows %zu  median |error| %.1f%%  max |error| %.1f%%\n\n", n, 100 * median, 100 * errs.back());
    // The planner on each row's model, GPU count and global batch, against the published layout.
    std::printf("%-4s %-14s %12s %12s %7s %9s %6s  %s\n", "row", "model", "published s", "planned s", "gain",
                "simulated", "time", "best plan");
    int not_worse = 0, rows = 0;
    for (const auto& row : loom::sim::read_published_runs(path)) {
      const loom::sim::PublishedCase pc = loom::sim::published_case(row);
      const double published = loom::sim::simulate(pc.plan, pc.cluster).step_time_s;
      loom::plan::PlanRequest req;
      req.like = pc.plan;  // the published framework's own communication
      req.cluster = pc.cluster;
      req.global_batch = pc.plan.cfg.train.batch;
      req.top = 1;
      const loom::plan::PlanReport rep = loom::plan::search_plans(req);
      ++rows;
      if (rep.ranked.empty()) {
        std::printf("%-4s no plan fits\n", row.id().c_str());
        continue;
      }
      const double planned = rep.ranked.front().result.step_time_s;
      not_worse += planned <= published * (1 + 1e-9);
      std::printf("%-4s %-14s %12.3f %12.3f %6.1f%% %9lld %5.2fs  %s\n", row.id().c_str(),
                  row.fields.at("model").c_str(), published, planned, 100 * (published / planned - 1),
                  static_cast<long long>(rep.evaluated), rep.total_s,
                  loom::plan::layout_label(rep.ranked.front().plan).substr(0, 90).c_str());
      std::fflush(stdout);
    }
    std::printf("planner at least as fast as the published layout (predicted) on %d of %d rows\n", not_worse, rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_published: %s\n", e.what());
    return 1;
  }
  return 0;
}
