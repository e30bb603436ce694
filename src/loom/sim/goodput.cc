#include "loom/sim/goodput.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace loom::sim {

double young_interval_s(double save_s, double mtbf_s) { return std::sqrt(2 * save_s * mtbf_s); }

double daly_interval_s(double save_s, double mtbf_s) {
  if (save_s >= 2 * mtbf_s) return mtbf_s;
  const double x = save_s / (2 * mtbf_s);
  return young_interval_s(save_s, mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - save_s;
}

double expected_goodput(double interval_s, double save_s, double restart_s, double mtbf_s) {
  const double m = mtbf_s;
  return interval_s / (m * std::exp(restart_s / m) * std::expm1((interval_s + save_s) / m));
}

GoodputReport goodput_report(const FailureModel& f, int64_t nodes, double step_s) {
  GoodputReport g;
  g.nodes = std::max<int64_t>(nodes, 1);
  g.job_mtbf_s = f.node_mtbf_s / double(std::max<int64_t>(nodes, 1));
  g.daly_s = daly_interval_s(f.save_s, g.job_mtbf_s);
  g.young_s = young_interval_s(f.save_s, g.job_mtbf_s);
  g.save_every = std::max<int64_t>(1, std::llround(g.daly_s / step_s));
  g.goodput = expected_goodput(double(g.save_every) * step_s, f.save_s, f.restart_s, g.job_mtbf_s);
  return g;
}

std::string goodput_text(const GoodputReport& g, int64_t nodes) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "goodput: job MTBF %.2f h over %lld nodes; save every %lld steps (Daly's optimum %.0f s of training, "
                "Young's %.0f s); expected goodput %.1f%% (Note [Goodput])",
                g.job_mtbf_s / 3600, static_cast<long long>(nodes), static_cast<long long>(g.save_every), g.daly_s,
                g.young_s, 100 * g.goodput);
  return buf;
}

}  // namespace loom::sim
