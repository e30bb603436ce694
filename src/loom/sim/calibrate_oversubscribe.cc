// loom calibrate's oversubscription figures (Note [Oversubscribed cores] in sim/cluster.cc):
// the throughput ranks keep when more of them than cores share the processor, and the wait
// each synchronisation then costs.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "loom/comm/group.h"
#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/kernels/kernels.h"
#include "loom/sim/calibrate.h"

extern "C" void openblas_set_num_threads(int);

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;

// One work unit of a rank: a linear layer's forward and backward, (rows x 256) x (256 x 1024),
// and a GELU on its output, on the rank's own operands (first touched by its thread). 1024
// rows: ~16 ms of a core here (a block's share of config B); 128 rows: ~2 ms.
constexpr int64_t IC = 256, OC = 1024;
struct Operands {
  explicit Operands(int64_t n) : rows(n) {}
  int64_t rows;
  std::vector<float> x = std::vector<float>(size_t(rows * IC), 0.5f), w = std::vector<float>(size_t(OC * IC), 0.25f),
                     b = std::vector<float>(size_t(OC), 0.f), y = std::vector<float>(size_t(rows * OC)),
                     g = std::vector<float>(size_t(rows * OC)), dy = std::vector<float>(size_t(rows * OC)),
                     dx = std::vector<float>(size_t(rows * IC)), dw = std::vector<float>(size_t(OC * IC)),
                     db = std::vector<float>(size_t(OC));
};

void unit(const Kernels& k, Operands& o) {
  k.matmul_forward(o.y.data(), o.x.data(), o.w.data(), o.b.data(), o.rows, IC, OC);
  k.gelu_forward(o.g.data(), o.y.data(), o.rows * OC);
  k.gelu_backward(o.dy.data(), o.y.data(), o.g.data(), o.rows * OC);
  k.matmul_backward(o.dx.data(), o.dw.data(), o.db.data(), o.dy.data(), o.x.data(), o.w.data(), o.rows, IC, OC, true);
}

struct Probe {
  int rows = 1024, rounds = 4, units = 4;
  int group = 0;  // ranks per synchronising group (consecutive ranks); 0: all
};

// Wall seconds of `ranks` ranks (threads over the collective layer's thread backend, whose
// waits spin and yield as the MPI backend's do) each running p.rounds rounds of p.units units
// on one thread, every round ending in an all-reduce of its group (a synchronisation): from
// the first round's start to the last rank's end. Not per-unit medians: a unit that is not
// preempted runs at a whole core's speed however many ranks share it; the cost is in the
// shares the scheduler gives the ranks between synchronisations (the slowest sets the
// round) and in the spinning of the ranks that wait.
double seconds(const Kernels& k, int ranks, const Probe& p) {
  std::vector<double> each(size_t(ranks), 0.0);
  std::vector<std::vector<int>> part(1);
  for (int r = 0; r < ranks; r++) {
    if (p.group > 0 && int(part.back().size()) == p.group) part.emplace_back();
    part.back().push_back(r);
  }
  const auto errors = comm::run_threads(ranks, {}, [&](comm::World& w) {
    omp_set_num_threads(1);
    Operands o(p.rows);
    unit(k, o);  // first touch, warm
    const std::unique_ptr<comm::Group> g = w.group(part, "sync");
    w.world_group().barrier().wait();
    const Clock::time_point t0 = Clock::now();
    for (int r = 0; r < p.rounds; r++) {
      for (int u = 0; u < p.units; u++) unit(k, o);
      g->all_reduce(std::span<float>(o.db)).wait();
    }
    each[size_t(w.global_rank())] = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  for (const auto& e : errors) LOOM_CHECK(e.empty(), "calibrate: oversubscription probe at ", ranks, " ranks failed: ", e);
  return *std::max_element(each.begin(), each.end());
}

// Units of p.units a round (a multiple of 4, so 2 and 4 ranks a core split them) filling
// `round_s` of a core, from a short timing of one rank per core.
int units_for(const Kernels& k, int cores, Probe p, double round_s) {
  p.rounds = 1, p.units = 4;
  const double unit_s = seconds(k, cores, p) / 4;
  return 4 * std::max(1, int(round_s / unit_s / 4));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// fair, over, fair, over, ..., fair: each `over` timing against the mean of the `fair` ones
// either side of it (a slow spell that starts or ends between them biases neither way); the
// medians of those ratios and of the fair timings.
struct Ratio {
  double ratio = 1, fair_s = 0;
};
Ratio bracketed(const std::function<double()>& fair, const std::function<double()>& over, int passes) {
  std::vector<double> f{fair()}, r;
  for (int p = 0; p < passes; p++) {
    const double o = over();
    f.push_back(fair());
    r.push_back((f[size_t(p)] + f[size_t(p) + 1]) / 2 / o);
  }
  return {median(r), median(f)};
}

}  // namespace

// Note [Oversubscribed cores]: two probes, each timing one rank per core and `per` ranks a
// core in turn with the same work split among them (each rank 1/per of the units), the figure
// the median over `passes` of each `per` timing against the one-a-core timings either side
// (this VM's slow spells last seconds to minutes; single timings scatter by +-10-20%):
//   kept(per): steps of ~0.1 s of a core's work ending in one all-reduce of all ranks (a
//     step's gradient sync), per 2 and 4: time(1 a core) / time(per a core);
//   sync_s: rounds of ~8 ms of a core's work ending in an all-reduce of pairs (a tensor-
//     parallel layer's), per 2: with r the median of time(1 a core) / time(2 a core) and
//     round the median round at one a core, round x (1 / r - 1 / kept(2)), the wait one
//     synchronisation costs beyond the shares.
Oversubscription measure_oversubscription(const Kernels& k, int cores, int passes, int threads_after) {
  Oversubscription out;
  if (cores < 2) return out;
  openblas_set_num_threads(1);
  Probe step{.rows = 1024, .rounds = 4, .units = 4, .group = 0};
  step.units = units_for(k, cores, step, 0.1);
  out.kept.points.emplace_back(1.0, 1.0);
  for (int per : {2, 4}) {
    const Probe split{step.rows, step.rounds, step.units / per, 0};
    const Ratio r = bracketed([&] { return seconds(k, cores, step); },
                              [&] { return seconds(k, cores * per, split); }, passes);
    out.kept.points.emplace_back(double(per), std::clamp(r.ratio, 0.05, 1.0));
  }
  Probe sync{.rows = 128, .rounds = 48, .units = 4, .group = 2};
  sync.units = units_for(k, cores, sync, 0.008);
  const Probe split{sync.rows, sync.rounds, sync.units / 2, 2};
  const Ratio r = bracketed([&] { return seconds(k, cores, sync); }, [&] { return seconds(k, 2 * cores, split); }, passes);
  out.sync_s = std::clamp(r.fair_s / sync.rounds * (1 / r.ratio - 1 / out.kept.at(2)), 0.0, 0.01);
  openblas_set_num_threads(threads_after);
  return out;
}

}  // namespace loom
