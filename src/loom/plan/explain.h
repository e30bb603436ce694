// Why `loom plan`'s first choice beats the runner-up, and how far its step time can be
// trusted (Note [Plan explanation]).
#pragma once

#include <string>
#include <vector>

#include "loom/plan/search.h"
#include "loom/sim/validation.h"

namespace loom::plan {

// One term of the step-time breakdown in both candidates.
struct TermDelta {
  std::string name;
  double first_s = 0, second_s = 0;
  double delta() const { return first_s - second_s; }  // negative: the first candidate spends less
};

// The breakdown terms of the two candidates, largest |difference| first (terms both leave at
// zero omitted).
std::vector<TermDelta> term_deltas(const sim::SimResult& first, const sim::SimResult& second);

// #1 against #2: the step-time gap (second - first), the terms that make it, and whether the
// gap is outside the simulator's usual error for the two kinds (Note [Plan explanation]).
struct Comparison {
  double gap_s = 0, gap_rel = 0;  // gap_rel: of the second's step time
  std::vector<TermDelta> terms;
  bool validated = false;         // both kinds have measured runs
  double noise = 0;               // the larger median |error| of the two kinds
  bool reliable = false;          // validated and |gap_rel| >= noise
};
Comparison compare(const PlanCandidate& first, const PlanCandidate& second, const sim::ErrorBand& first_band,
                   const sim::ErrorBand& second_band);

// The explanation `loom plan --explain` prints: the comparison above as text, with the
// memory of each.
std::string explain_choice(const PlanCandidate& first, const PlanCandidate& second, const sim::ErrorBand& first_band,
                           const sim::ErrorBand& second_band);

// The points a plan's error bands come from: the published runs for the GPU frameworks;
// for loom's engine the file bench/sim_vs_engine wrote beside `cluster_path` (empty when
// the cluster is a preset or it has not run).
std::vector<sim::ValidationPoint> validation_points(sim::Framework f, const std::string& cluster_path);
std::string validation_what(sim::Framework f);  // "published" | "measured loom-engine"

}  // namespace loom::plan
