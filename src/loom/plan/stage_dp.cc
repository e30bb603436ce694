#include "loom/plan/stage_dp.h"

#include <algorithm>
#include <limits>

namespace loom::plan {

// Note [Stage DP]
// best[s][j]: the smallest bottleneck splitting layers [0, j) into stages 0..s-1.
//   best[s][j] = min over i < j of max(best[s-1][i], cost(s-1, i, j))
// with cost(k, i, j) = sum of layer_s[i..j) (+ first_extra if k = 0, + last_extra if
// j = L), infinite when j - i exceeds stage k's cap. O(stages x L^2) with prefix sums;
// ties keep the earliest split point, which pushes layers toward later stages.

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Costs {
  const std::vector<double>& layer_s;
  int stages;
  double first, last;
  const std::vector<int>& cap;
  std::vector<double> prefix;
  double operator()(int k, int i, int j) const {
    if (j <= i) return kInf;
    if (!cap.empty() && j - i > cap[size_t(k)]) return kInf;
    const int L = int(layer_s.size());
    return prefix[size_t(j)] - prefix[size_t(i)] + (k == 0 ? first : 0) + (j == L ? last : 0);
  }
};

Costs make_costs(const std::vector<double>& layer_s, int stages, double first, double last,
                 const std::vector<int>& cap) {
  Costs c{layer_s, stages, first, last, cap, std::vector<double>(layer_s.size() + 1, 0)};
  for (size_t i = 0; i < layer_s.size(); ++i) c.prefix[i + 1] = c.prefix[i] + layer_s[i];
  return c;
}

}  // namespace

StageSplit split_stages(const std::vector<double>& layer_s, int stages, double first_extra_s, double last_extra_s,
                        const std::vector<int>& max_layers) {
  const int L = int(layer_s.size());
  StageSplit out;
  if (stages < 1 || stages > L || (!max_layers.empty() && int(max_layers.size()) != stages)) return out;
  const Costs cost = make_costs(layer_s, stages, first_extra_s, last_extra_s, max_layers);
  std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(L) + 1, kInf));
  std::vector<std::vector<int>> from(size_t(stages) + 1, std::vector<int>(size_t(L) + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int j = s; j <= L - (stages - s); ++j)
      for (int i = s - 1; i < j; ++i) {
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

StageSplit split_stages_brute_force(const std::vector<double>& layer_s, int stages, double first_extra_s,
                                    double last_extra_s, const std::vector<int>& max_layers) {
  const int L = int(layer_s.size());
  StageSplit out;
  if (stages < 1 || stages > L) return out;
  const Costs cost = make_costs(layer_s, stages, first_extra_s, last_extra_s, max_layers);
  std::vector<int> cut(size_t(stages) + 1, 0);  // stage k = [cut[k], cut[k+1])
  cut[size_t(stages)] = L;
  double best = kInf;
  // Enumerate cut[1] < ... < cut[stages-1] in (0, L).
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
    for (int c = cut[size_t(k - 1)] + 1; c <= L - (stages - k); ++c) {
      cut[size_t(k)] = c;
      self(self, k + 1);
    }
  };
  if (stages == 1) {
    out.layers = {L};
    best = cost(0, 0, L);
  } else {
    rec(rec, 1);
  }
  if (best == kInf) out.layers.clear();
  out.bottleneck_s = best == kInf ? 0 : best;
  return out;
}

}  // namespace loom::plan
