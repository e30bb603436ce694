#include "loom/plan/explain.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace loom::plan {

// Note [Plan explanation]
// `loom plan --explain` compares the first two candidates term by term over the simulator's
// breakdown of the slowest rank's step (Breakdown in sim/simulator.h: compute, recompute,
// exposed tp / cp / ZeRO communication, pipeline idle, exposed dp reduction, optimizer,
// exposed parameter fetch), so the user sees which cost the winner avoids and which it pays
// more of, and their peak memory. Then it weighs the gap against the simulator's own error
// (Note [Error bands]): when the relative step-time gap is smaller than the larger median
// |error| of the two candidates' kinds, the ranking is within the noise the validation
// showed and the output says the order is not reliable; a kind without validation says
// that too.

std::vector<TermDelta> term_deltas(const sim::SimResult& first, const sim::SimResult& second) {
  const sim::Breakdown &a = first.breakdown, &b = second.breakdown;
  std::vector<TermDelta> out = {
      {"compute", a.compute, b.compute},
      {"recompute", a.recompute, b.recompute},
      {"exposed tensor-parallel comm", a.tp_comm, b.tp_comm},
      {"exposed context-parallel comm", a.cp_comm, b.cp_comm},
      {"exposed ZeRO gathers / reduce-scatters", a.zero_comm, b.zero_comm},
      {"pipeline idle (bubble)", a.pp_idle, b.pp_idle},
      {"exposed data-parallel reduction", a.dp_exposed, b.dp_exposed},
      {"optimizer", a.optimizer, b.optimizer},
      {"exposed offloaded-parameter fetch", a.param_fetch, b.param_fetch},
  };
  out.erase(std::remove_if(out.begin(), out.end(), [](const TermDelta& t) { return t.first_s == 0 && t.second_s == 0; }),
            out.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const TermDelta& x, const TermDelta& y) { return std::fabs(x.delta()) > std::fabs(y.delta()); });
  return out;
}

std::string explain_choice(const PlanCandidate& first, const PlanCandidate& second, const sim::ErrorBand& first_band,
                           const sim::ErrorBand& second_band) {
  const sim::SimResult &a = first.result, &b = second.result;
  const double gap = b.step_time_s - a.step_time_s, rel = b.step_time_s > 0 ? gap / b.step_time_s : 0;
  const double gib = double(int64_t(1) << 30);
  std::ostringstream os;
  os << std::fixed << std::setprecision(4) << "why #1 (" << layout_label(first.plan) << ") over #2 ("
     << layout_label(second.plan) << "): its step is " << gap << " s shorter (" << std::setprecision(1) << 100 * rel
     << "%)\n";
  os << "  term (slowest rank, s per step)            #1         #2     #1 - #2\n";
  for (const TermDelta& t : term_deltas(a, b))
    os << "  " << std::left << std::setw(40) << t.name << std::right << std::setprecision(4) << std::setw(9)
       << t.first_s << std::setw(11) << t.second_s << std::showpos << std::setw(12) << t.delta() << std::noshowpos
       << "\n";
  os << std::setprecision(1) << "  peak memory: " << a.peak_memory_bytes / gib << " vs " << b.peak_memory_bytes / gib
     << " GiB\n";
  if (first_band.rows == 0 || second_band.rows == 0) {
    os << "  no validation for " << (first_band.rows == 0 ? first_band.basis : second_band.basis)
       << ": how far this ranking can be trusted is unknown\n";
  } else {
    const double noise = std::max(first_band.median_abs, second_band.median_abs);
    os << "  the gap is " << (std::fabs(rel) < noise ? "inside" : "outside") << " the simulator's median |error| for "
       << "these kinds (" << 100 * noise << "%): "
       << (std::fabs(rel) < noise ? "the order of #1 and #2 is not reliable" : "the order should hold")
       << "\n";
  }
  return os.str();
}

std::vector<sim::ValidationPoint> validation_points(sim::Framework f, const std::string& cluster_path) {
  if (f != sim::Framework::kLoom) return sim::published_points();
  if (cluster_path.empty()) return {};
  return sim::engine_points(sim::validation_path_for(cluster_path));
}

std::string validation_what(sim::Framework f) {
  return f == sim::Framework::kLoom ? "measured loom-engine" : "published";
}

}  // namespace loom::plan
