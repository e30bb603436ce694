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
      {"vocabulary passes' comm over the pipeline", a.vocab_comm, b.vocab_comm},
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

Comparison compare(const PlanCandidate& first, const PlanCandidate& second, const sim::ErrorBand& first_band,
                   const sim::ErrorBand& second_band) {
  Comparison c;
  c.gap_s = second.result.step_time_s - first.result.step_time_s;
  c.gap_rel = second.result.step_time_s > 0 ? c.gap_s / second.result.step_time_s : 0;
  c.terms = term_deltas(first.result, second.result);
  c.validated = first_band.rows > 0 && second_band.rows > 0;
  c.noise = std::max(first_band.median_abs, second_band.median_abs);
  c.reliable = c.validated && std::fabs(c.gap_rel) >= c.noise;
  return c;
}

std::string explain_choice(const PlanCandidate& first, const PlanCandidate& second, const sim::ErrorBand& first_band,
                           const sim::ErrorBand& second_band) {
  const Comparison c = compare(first, second, first_band, second_band);
  const double gib = double(int64_t(1) << 30);
  std::ostringstream os;
  os << std::fixed << std::setprecision(4) << "why #1 (" << layout_label(first.plan) << ") over #2 ("
     << layout_label(second.plan) << "): its step is " << c.gap_s << " s shorter (" << std::setprecision(1)
     << 100 * c.gap_rel << "%)\n";
  os << "  term (slowest rank, s per step)            #1         #2     #1 - #2\n";
  for (const TermDelta& t : c.terms)
    os << "  " << std::left << std::setw(40) << t.name << std::right << std::setprecision(4) << std::setw(9)
       << t.first_s << std::setw(11) << t.second_s << std::showpos << std::setw(12) << t.delta() << std::noshowpos
       << "\n";
  os << std::setprecision(1) << "  peak memory: " << first.result.peak_memory_bytes / gib << " vs "
     << second.result.peak_memory_bytes / gib << " GiB\n";
  if (!c.validated)
    os << "  no validation for " << (first_band.rows == 0 ? first_band.basis : second_band.basis)
       << ": how far this ranking can be trusted is unknown\n";
  else
    os << "  the gap is " << (c.reliable ? "outside" : "inside") << " the simulator's median |error| for these kinds ("
       << 100 * c.noise << "%): " << (c.reliable ? "the order should hold" : "the order of #1 and #2 is not reliable")
       << "\n";
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
