#include "loom/plan/layer_ilp.h"

#include <coin/Cbc_C_Interface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "loom/core/error.h"

namespace loom::plan {

// Note [Layer ILP]
// Variables: x[l][k] in {0, 1} (layer l uses strategy k); e[l][a][b] in [0, 1] for each
// priced edge (x[l][a] AND x[l+1][b], linearised as e >= x[l][a] + x[l+1][b] - 1; with a
// positive price the minimisation drives it to exactly that product); T >= 0.
//   minimise T
//   sum_k x[l][k] = 1                                   for every layer
//   sum_{l in g, k} mem[l][k] x[l][k] <= budget[g]      for every stage g
//   base[g] + sum_{l in g, k} t[l][k] x[l][k] + sum_{edges out of g} price e <= T
// Alpa's intra-op pass has the same one-hot + edge-product shape; minimising the slowest
// stage rather than the sum is what a pipeline's step time depends on.

namespace {

struct CbcDeleter {
  void operator()(Cbc_Model* m) const { Cbc_deleteModel(m); }
};

void check_problem(const LayerIlp& p) {
  const size_t L = p.layers.size();
  LOOM_CHECK(p.group.size() == L, "layer ILP: ", p.group.size(), " stage ids for ", L, " layers");
  const size_t G = p.group_budget_bytes.size();
  LOOM_CHECK(p.group_base_s.size() == G, "layer ILP: ", p.group_base_s.size(), " stage times for ", G, " stages");
  for (size_t l = 0; l < L; ++l) {
    LOOM_CHECK(!p.layers[l].empty(), "layer ILP: layer ", l, " has no strategy");
    LOOM_CHECK(p.group[l] >= 0 && size_t(p.group[l]) < G, "layer ILP: layer ", l, " is in stage ", p.group[l],
               " of ", G);
  }
  LOOM_CHECK(p.reshard.empty() || p.reshard.size() + 1 >= L, "layer ILP: reshard prices for ", p.reshard.size(),
             " edges of ", L, " layers");
}

double edge_price(const LayerIlp& p, size_t l, int a, int b) {
  if (l >= p.reshard.size() || p.reshard[l].empty()) return 0;
  return p.reshard[l][size_t(a)][size_t(b)];
}

}  // namespace

IlpEvaluation evaluate_assignment(const LayerIlp& p, const std::vector<int>& choice) {
  check_problem(p);
  LOOM_CHECK(choice.size() == p.layers.size(), "layer ILP: ", choice.size(), " choices for ", p.layers.size(), " layers");
  IlpEvaluation ev;
  std::vector<double> time = p.group_base_s;
  ev.group_memory_bytes.assign(p.group_budget_bytes.size(), 0);
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const Strategy& s = p.layers[l][size_t(choice[l])];
    time[size_t(p.group[l])] += s.time_s;
    ev.group_memory_bytes[size_t(p.group[l])] += s.memory_bytes;
    if (l + 1 < p.layers.size()) time[size_t(p.group[l])] += edge_price(p, l, choice[l], choice[l + 1]);
  }
  ev.objective_s = *std::max_element(time.begin(), time.end());
  for (size_t g = 0; g < time.size(); ++g)
    if (ev.group_memory_bytes[g] > p.group_budget_bytes[g] * (1 + 1e-12)) ev.within_budget = false;
  return ev;
}

namespace {

// Note [Layer ILP] symmetry: a stage's identical layers (same strategies, no resharding
// prices) are interchangeable, and CBC wastes its time proving that. Without prices, each
// class of identical layers becomes one integer count per strategy (how many of its layers
// take it) and the solution lists them in strategy order: the same optimum, no symmetry.
bool identical(const std::vector<Strategy>& a, const std::vector<Strategy>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k].time_s != b[k].time_s || a[k].memory_bytes != b[k].memory_bytes) return false;
  return true;
}

IlpSolution solve_by_counts(const LayerIlp& p, double time_limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<size_t> rep;                    // per class: its first layer
  std::vector<std::vector<size_t>> members;   // per class: its layers, in order
  for (size_t l = 0; l < p.layers.size(); ++l) {
    size_t c = 0;
    while (c < rep.size() && !(p.group[rep[c]] == p.group[l] && identical(p.layers[rep[c]], p.layers[l]))) ++c;
    if (c == rep.size()) rep.push_back(l), members.emplace_back();
    members[c].push_back(l);
  }
  std::unique_ptr<Cbc_Model, CbcDeleter> m(Cbc_newModel());
  Cbc_setLogLevel(m.get(), 0);
  Cbc_setMaximumSeconds(m.get(), time_limit_s);
  Cbc_addCol(m.get(), "T", 0, 1e30, 1.0, 0, 0, nullptr, nullptr);
  std::vector<std::vector<int>> y(rep.size());
  int col = 1;
  for (size_t c = 0; c < rep.size(); ++c)
    for (size_t k = 0; k < p.layers[rep[c]].size(); ++k) {
      Cbc_addCol(m.get(), "", 0, double(members[c].size()), 0, 1, 0, nullptr, nullptr);
      y[c].push_back(col++);
    }
  for (size_t c = 0; c < rep.size(); ++c) {
    const std::vector<double> ones(y[c].size(), 1.0);
    Cbc_addRow(m.get(), "", int(y[c].size()), y[c].data(), ones.data(), 'E', double(members[c].size()));
  }
  for (size_t g = 0; g < p.group_budget_bytes.size(); ++g) {
    std::vector<int> mc, tc = {0};
    std::vector<double> mv, tv = {-1};
    for (size_t c = 0; c < rep.size(); ++c) {
      if (size_t(p.group[rep[c]]) != g) continue;
      for (size_t k = 0; k < y[c].size(); ++k) {
        mc.push_back(y[c][k]), mv.push_back(p.layers[rep[c]][k].memory_bytes);
        tc.push_back(y[c][k]), tv.push_back(p.layers[rep[c]][k].time_s);
      }
    }
    if (!mc.empty()) Cbc_addRow(m.get(), "", int(mc.size()), mc.data(), mv.data(), 'L', p.group_budget_bytes[g]);
    Cbc_addRow(m.get(), "", int(tc.size()), tc.data(), tv.data(), 'L', -p.group_base_s[g]);
  }
  Cbc_solve(m.get());
  IlpSolution out;
  out.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double* sol = Cbc_getColSolution(m.get());
  if (Cbc_isProvenInfeasible(m.get()) || !sol) {
    out.status = "infeasible";
    return out;
  }
  out.choice.assign(p.layers.size(), 0);
  for (size_t c = 0; c < rep.size(); ++c) {
    size_t next = 0;
    for (size_t k = 0; k < y[c].size(); ++k)
      for (long n = std::lround(sol[y[c][k]]); n > 0 && next < members[c].size(); --n) out.choice[members[c][next++]] = int(k);
  }
  const IlpEvaluation ev = evaluate_assignment(p, out.choice);
  out.feasible = ev.within_budget;
  out.objective_s = ev.objective_s;
  out.status = Cbc_isProvenOptimal(m.get()) ? "optimal" : (out.feasible ? "feasible (time limit)" : "infeasible");
  return out;
}

}  // namespace

IlpSolution solve_layer_ilp(const LayerIlp& p, double time_limit_s) {
  check_problem(p);
  bool priced = false;
  for (const auto& edge : p.reshard)
    for (const auto& row : edge)
      for (double v : row) priced = priced || v != 0;
  if (!priced) return solve_by_counts(p, time_limit_s);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Cbc_Model, CbcDeleter> m(Cbc_newModel());
  Cbc_setLogLevel(m.get(), 0);
  Cbc_setMaximumSeconds(m.get(), time_limit_s);
  const size_t L = p.layers.size(), G = p.group_budget_bytes.size();
  // Columns: T, then x[l][k], then priced edges.
  Cbc_addCol(m.get(), "T", 0, 1e30, 1.0, 0, 0, nullptr, nullptr);
  std::vector<std::vector<int>> x(L);
  int col = 1;
  for (size_t l = 0; l < L; ++l)
    for (size_t k = 0; k < p.layers[l].size(); ++k) {
      Cbc_addCol(m.get(), "", 0, 1, 0, 1, 0, nullptr, nullptr);
      x[l].push_back(col++);
    }
  struct Edge {
    int col;
    size_t l;
    double price;
  };
  std::vector<Edge> edges;
  for (size_t l = 0; l + 1 < L; ++l)
    for (size_t a = 0; a < p.layers[l].size(); ++a)
      for (size_t b = 0; b < p.layers[l + 1].size(); ++b)
        if (const double price = edge_price(p, l, int(a), int(b)); price > 0) {
          Cbc_addCol(m.get(), "", 0, 1, 0, 0, 0, nullptr, nullptr);
          edges.push_back({col, l, price});
          const int cols[3] = {col, x[l][a], x[l + 1][b]};
          const double coefs[3] = {1, -1, -1};
          Cbc_addRow(m.get(), "", 3, cols, coefs, 'G', -1);  // e >= xa + xb - 1
          ++col;
        }
  for (size_t l = 0; l < L; ++l) {
    const std::vector<double> ones(x[l].size(), 1.0);
    Cbc_addRow(m.get(), "", int(x[l].size()), x[l].data(), ones.data(), 'E', 1);
  }
  for (size_t g = 0; g < G; ++g) {
    std::vector<int> mc, tc = {0};
    std::vector<double> mv, tv = {-1};
    for (size_t l = 0; l < L; ++l) {
      if (size_t(p.group[l]) != g) continue;
      for (size_t k = 0; k < x[l].size(); ++k) {
        mc.push_back(x[l][k]), mv.push_back(p.layers[l][k].memory_bytes);
        tc.push_back(x[l][k]), tv.push_back(p.layers[l][k].time_s);
      }
    }
    for (const Edge& e : edges)
      if (size_t(p.group[e.l]) == g) tc.push_back(e.col), tv.push_back(e.price);
    if (!mc.empty()) Cbc_addRow(m.get(), "", int(mc.size()), mc.data(), mv.data(), 'L', p.group_budget_bytes[g]);
    Cbc_addRow(m.get(), "", int(tc.size()), tc.data(), tv.data(), 'L', -p.group_base_s[g]);  // base + sum - T <= 0
  }
  Cbc_solve(m.get());
  IlpSolution out;
  out.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (Cbc_isProvenInfeasible(m.get()) || !Cbc_getColSolution(m.get())) {
    out.status = "infeasible";
    return out;
  }
  const double* sol = Cbc_getColSolution(m.get());
  for (size_t l = 0; l < L; ++l) {
    int pick = 0;
    for (size_t k = 0; k < x[l].size(); ++k)
      if (sol[x[l][k]] > sol[x[l][size_t(pick)]]) pick = int(k);
    out.choice.push_back(pick);
  }
  const IlpEvaluation ev = evaluate_assignment(p, out.choice);
  out.feasible = ev.within_budget;
  out.objective_s = ev.objective_s;
  out.status = Cbc_isProvenOptimal(m.get()) ? "optimal" : (out.feasible ? "feasible (time limit)" : "infeasible");
  return out;
}

}  // namespace loom::plan
