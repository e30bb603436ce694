// loom calibrate's overlap cost (Note [Overlap contention] in sim/costs.cc): the compute a
// rank loses while its group's worker thread runs a collective beside it.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <span>
#include <thread>
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

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One rank's pass: its GEMM loop alone, its collectives alone, and the loop with the
// collectives queued beside it. Every timing is taken between barriers, so every rank computes
// (and communicates) at once, as ranks that fill the cores do in a step.
struct PassTimes {
  double alone = 0, comm = 0, with = 0;
};

// A linear layer of loom's config-A scale, (1024 x 256) x (256 x 1024), and a ZeRO-3 gather
// of one unit's pieces, 1 MiB a rank.
constexpr int64_t N = 1024, IC = 256, OC = 1024;
struct Buffers {
  explicit Buffers(int ranks) : all(piece.size() * size_t(ranks)) {}
  std::vector<float> x = std::vector<float>(size_t(N * IC), 0.5f), wt = std::vector<float>(size_t(OC * IC), 0.25f),
                     y = std::vector<float>(size_t(N * OC)), piece = std::vector<float>(size_t(1) << 18, 1.0f), all;
};

PassTimes one_pass(comm::World& w, const Kernels& k, Buffers& b, int gemms, int collectives) {
  std::vector<float>&x = b.x, &wt = b.wt, &y = b.y, &piece = b.piece, &all = b.all;
  comm::Group& g = w.world_group();
  auto compute = [&] {
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < gemms; i++) k.matmul_forward(y.data(), x.data(), wt.data(), nullptr, N, IC, OC);
    return seconds_since(t0);
  };
  PassTimes t;
  g.barrier();
  t.alone = compute();
  g.barrier();
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < collectives; i++) g.all_gather(std::span<const float>(piece), std::span<float>(all));
  t.comm = seconds_since(t0);
  g.barrier();
  std::vector<comm::Work> works;
  for (int i = 0; i < collectives; i++)
    works.push_back(g.all_gather(std::span<const float>(piece), std::span<float>(all), {.async = true}));
  t.with = compute();
  for (comm::Work& wk : works) wk.wait();
  g.barrier();
  return t;
}

}  // namespace

// Ranks as threads (the collective layer's thread backend, as the busbw tables), one per
// core up to 8 (beyond, the spare cores can take the workers: the cost of that many ranks on a
// bigger machine, a lower bound for ranks that fill it), each computing on one thread. A warm-up
// pass sizes the GEMM loop to at least three times the collectives alone, so they finish inside
// it. Each pass gives the ranks' mean of (with - alone) / comm from that pass's own timings; the
// cost is the median over `passes`, clamped to the spec's 0..4 (a ratio: each pass's three
// timings are taken together, so the median, not each timing's fastest - the fastest "with"
// is the pass where the collectives happened to contend least). 0 with fewer than two cores (no
// rank shares its core with another's collectives).
double measure_overlap_cost(const Kernels& k, int passes, int threads_after) {
  const int ranks = int(std::min(8u, std::thread::hardware_concurrency()));
  if (ranks < 2) return 0;
  openblas_set_num_threads(1);  // global: each rank's GEMMs on its own thread
  std::mutex mu;
  std::vector<std::vector<double>> ratios(static_cast<size_t>(passes));
  const auto errors = comm::run_threads(ranks, {}, [&](comm::World& w) {
    omp_set_num_threads(1);
    Buffers b(w.world_size());
    const PassTimes warm = one_pass(w, k, b, 8, 24);
    const int gemms = std::max(8, int(std::ceil(3.0 * warm.comm / std::max(1e-9, warm.alone / 8))));
    for (int p = 0; p < passes; p++) {
      const PassTimes t = one_pass(w, k, b, gemms, 24);
      std::lock_guard<std::mutex> lock(mu);
      ratios[size_t(p)].push_back((t.with - t.alone) / std::max(1e-9, t.comm));
    }
  });
  openblas_set_num_threads(threads_after);
  for (const auto& e : errors) LOOM_CHECK(e.empty(), "calibrate: overlap measurement at ", ranks, " ranks failed: ", e);
  std::vector<double> means;
  for (const std::vector<double>& r : ratios) {
    double sum = 0;
    for (double v : r) sum += v;
    means.push_back(sum / double(r.size()));
  }
  std::sort(means.begin(), means.end());
  return std::clamp(means[means.size() / 2], 0.0, 4.0);
}

}  // namespace loom
