#include "loom/plan/stage_dp.h"

#include <algorithm>
#include <limits>

namespace loom::plan {

// Note [Stage DP]
// best[s][j]: the smallest bottleneck splitting layers [0, j) into stages 0..s-1.
//   best[s][j] = min over i <= j of max(best[s-1][i], cost(s-1, i, j))
// with cost(k, i, j) = sum of layer_s[i..j) (+ first_extra if k = 0, + last_extra if
// k = stages - 1), infinite when j - i exceeds stage k's cap or the stage is empty, except that an
// empty first or last stage (it only embeds, or only runs the head: Note [Stage split] in
// core/parallel_config.cc) is allowed where the variant says so. O(stages x L^2) with
// prefix sums; ties keep the earliest split point, which pushes layers toward later
// stages. With empty ends allowed the three variants that empty one or both ends are
// taken only when strictly better than the split with every stage holding a block.

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Costs {
  const std::vector<double>& layer_s;
  int stages;
  double first, last;
  const std::vector<int>& cap;
  bool empty_first = false, empty_last = false;
  std::vector<double> prefix;
  double operator()(int k, int i, int j) const {
    const int L = int(layer_s.size());
    const bool may_be_empty = (k == 0 && empty_first) || (k == stages - 1 && j == L && empty_last);
    if (j < i || (j == i && !may_be_empty)) return kInf;
    if (!cap.empty() && j - i > cap[size_t(k)]) return kInf;
    return prefix[size_t(j)] - prefix[size_t(i)] + (k == 0 ? first : 0) + (k == stages - 1 ? last : 0);
  }
};

Costs make_costs(const std::vector<double>& layer_s, int stages, double first, double last,
                 const std::vector<int>& cap, bool empty_first, bool empty_last) {
  Costs c{layer_s, stages, first, last, cap, empty_first, empty_last, std::vector<double>(layer_s.size() + 1, 0)};
  for (size_t i = 0; i < layer_s.size(); ++i) c.prefix[i + 1] = c.prefix[i] + layer_s[i];
  return c;
}

StageSplit dp_split(const Costs& cost) {
  const int L = int(cost.layer_s.size()), stages = cost.stages;
  StageSplit out;
  std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(L) + 1, kInf));
  std::vector<std::vector<int>> from(size_t(stages) + 1, std::vector<int>(size_t(L) + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int j = 0; j <= L; ++j)
      for (int i = 0; i <= j; ++i) {
        if (best[size_t(s - 1)][size_t(i)] == kInf) continue;
        const double v = std::max(best[size_t(s - 1)][size_t(i)], cost(s - 1, i, j));
        if (v < best[size_t(s)][size_t(j)]) {
          best[size_t(s)][size_t(j)] = v;
          from[size_t(s)][size_t(j)] = i;
        }
      }
  if (best[size_t(stages)][size_t(L)] == kInf) return out;
  out.bottleneck_s = best[size_t(stages)][size_t(L)];
  out.layers.assign(size_t(stages), 0);
  for (int s = stages, j = L; s > 0; --s) {
    const int i = from[size_t(s)][size_t(j)];
    out.layers[size_t(s - 1)] = j - i;
    j = i;
  }
  return out;
}

// Every split with cut[0] = 0 <= cut[1] <= ... <= cut[stages] = L, costed (empty stages
// other than the ends cost infinity).
StageSplit brute_split(const Costs& cost) {
  const int L = int(cost.layer_s.size()), stages = cost.stages;
  StageSplit out;
  std::vector<int> cut(size_t(stages) + 1, 0);  // stage k = [cut[k], cut[k+1])
  cut[size_t(stages)] = L;
  double best = kInf;
  auto rec = [&](auto&& self, int k) -> void {
    if (k == stages) {
      double worst = 0;
      for (int s = 0; s < stages; ++s) worst = std::max(worst, cost(s, cut[size_t(s)], cut[size_t(s + 1)]));
      if (worst < best) {
        best = worst;
        out.layers.clear();
        for (int s = 0; s < stages; ++s) out.layers.push_back(cut[size_t(s + 1)] - cut[size_t(s)]);
      }
      return;
    }
    for (int c = cut[size_t(k - 1)]; c <= L; ++c) {
      cut[size_t(k)] = c;
      self(self, k + 1);
    }
  };
  rec(rec, 1);
  if (best == kInf) out.layers.clear();
  out.bottleneck_s = best == kInf ? 0 : best;
  return out;
}

// The no-empty split, or a variant with empty ends where allowed and strictly better.
template <class Solve>
StageSplit best_variant(const std::vector<double>& layer_s, int stages, double first, double last,
                        const std::vector<int>& cap, bool empty_ends, Solve solve) {
  if (stages < 1 || (!cap.empty() && int(cap.size()) != stages)) return {};
  StageSplit out = solve(make_costs(layer_s, stages, first, last, cap, false, false));
  if (!empty_ends || stages < 2) return out;
  for (const auto [ef, el] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
    const StageSplit v = solve(make_costs(layer_s, stages, first, last, cap, ef, el));
    if (!v.layers.empty() && (out.layers.empty() || v.bottleneck_s < out.bottleneck_s)) out = v;
  }
  return out;
}

}  // namespace

StageSplit split_stages(const std::vector<double>& layer_s, int stages, double first_extra_s, double last_extra_s,
                        const std::vector<int>& max_layers, bool empty_ends) {
  return best_variant(layer_s, stages, first_extra_s, last_extra_s, max_layers, empty_ends, dp_split);
}

StageSplit split_stages_brute_force(const std::vector<double>& layer_s, int stages, double first_extra_s,
                                    double last_extra_s, const std::vector<int>& max_layers, bool empty_ends) {
  return best_variant(layer_s, stages, first_extra_s, last_extra_s, max_layers, empty_ends, brute_split);
}

}  // namespace loom::plan
