// The per-layer strategy integer program (Alpa-style, Note [Layer ILP]), solved by COIN-OR
// CBC, with an independent evaluator that recomputes the cost of any assignment.
#pragma once

#include <string>
#include <vector>

namespace loom::plan {

struct Strategy {
  std::string name;
  double time_s = 0;         // what the layer costs on its stage's critical path with it
  double memory_bytes = 0;   // what it keeps alive on its stage at the stage's peak
};

struct LayerIlp {
  std::vector<std::vector<Strategy>> layers;  // per layer (or operator group): its choices
  std::vector<int> group;                     // per layer: its pipeline stage
  std::vector<double> group_budget_bytes;     // per stage: memory the choices may use
  std::vector<double> group_base_s;           // per stage: time not decided here
  // reshard[l][a][b]: seconds between layer l with choice a and layer l + 1 with choice b
  // (the placement table's price of the conversion); empty means free.
  std::vector<std::vector<std::vector<double>>> reshard;
};

struct IlpSolution {
  bool feasible = false;
  std::vector<int> choice;      // per layer
  double objective_s = 0;       // slowest stage: base + chosen times + reshards
  double solve_s = 0;           // wall time of the solver
  std::string status;
};

// Minimises the slowest stage (T >= base_g + sum of its layers' chosen times and
// reshards) subject to one choice per layer and each stage's memory budget. Throws
// loom::Error on a malformed problem; an infeasible one returns feasible = false.
IlpSolution solve_layer_ilp(const LayerIlp& p, double time_limit_s = 10);

// The objective and each stage's memory of an assignment, from the problem alone.
struct IlpEvaluation {
  double objective_s = 0;
  std::vector<double> group_memory_bytes;
  bool within_budget = true;
};
IlpEvaluation evaluate_assignment(const LayerIlp& p, const std::vector<int>& choice);

}  // namespace loom::plan
