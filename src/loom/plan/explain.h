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

// The explanation `loom plan --explain` prints: the step-time gap, the terms that make it,
// the memory of each, and whether the gap is inside the error bands of the two kinds.
std::string explain_choice(const PlanCandidate& first, const PlanCandidate& second, const sim::ErrorBand& first_band,
                           const sim::ErrorBand& second_band);

// The points a plan's error bands come from: the published runs for the GPU frameworks;
// for loom's engine the file bench/sim_vs_engine wrote beside `cluster_path` (empty when
// the cluster is a preset or it has not run).
std::vector<sim::ValidationPoint> validation_points(sim::Framework f, const std::string& cluster_path);
std::string validation_what(sim::Framework f);  // "published" | "measured loom-engine"

}  // namespace loom::plan
