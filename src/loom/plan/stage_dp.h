// Pipeline stage split: a dynamic program over contiguous layer ranges (Note [Stage DP]).
#pragma once

#include <vector>

namespace loom::plan {

struct StageSplit {
  std::vector<int> layers;   // per stage, summing to the layer count; empty if infeasible
  double bottleneck_s = 0;   // the slowest stage's time
};

// Splits layers with per-layer times `layer_s` into `stages` contiguous non-empty stages
// minimising the slowest stage, where stage 0 also pays `first_extra_s` (embedding) and
// the last `last_extra_s` (head + loss). `max_layers` (optional, per stage) caps each
// stage's layer count, e.g. what its memory holds given the micro-batches in flight.
// `empty_ends`: the first and/or last stage may hold no layer (only the embedding, only
// the head) where that is strictly better (Note [Stage DP]).
StageSplit split_stages(const std::vector<double>& layer_s, int stages, double first_extra_s, double last_extra_s,
                        const std::vector<int>& max_layers = {}, bool empty_ends = false);
// Every split enumerated; the tests' oracle for small layer counts.
StageSplit split_stages_brute_force(const std::vector<double>& layer_s, int stages, double first_extra_s,
                                    double last_extra_s, const std::vector<int>& max_layers = {},
                                    bool empty_ends = false);

}  // namespace loom::plan
