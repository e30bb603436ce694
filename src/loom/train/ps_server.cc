// A parameter server's run (Note [Parameter server] in parallel/ps.h): its key range's
// weights and AdamW moments, one synchronous round per training step.
#include "loom/train/ps_server.h"

#include <algorithm>
#include <cmath>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/core/memory.h"
#include "loom/kernels/kernels.h"
#include "loom/model/layout.h"
#include "loom/optim/optimizer.h"
#include "loom/parallel/ps.h"

namespace loom {

TrainSummary run_ps_server(const Config& cfg, comm::World& world) {
  const int workers = int(cfg.parallel.dp), servers = int(cfg.parallel.ps_servers);
  const std::unique_ptr<comm::Group> peers = parallel::ps_role_group(world, workers, servers);  // the servers
  const int me = world.global_rank() - workers;
  const ParamLayout layout(cfg.model);
  const FlatRange own = parallel::ps_partition(layout.total_floats(), servers)[size_t(me)];
  // Whole-buffer vectors indexed by flat offset (AdamW's convention); only the own range is
  // ever written, the rest of the pages are handed back untouched.
  std::vector<float> params(size_t(layout.total_floats())), mean(params.size());
  release_pages(params.data(), int64_t(params.size() * sizeof(float)));
  release_pages(mean.data(), int64_t(mean.size() * sizeof(float)));
  AdamW adamw(layout, cfg.optim, {own});
  const Kernels& k = kernels(KernelBackend::kCpu);
  comm::Group& all = world.world_group();
  const std::span<float> p(params.data() + own.offset, size_t(own.count)), g(mean.data() + own.offset, size_t(own.count));
  all.recv(p, 0, parallel::kPsInitTag);  // worker 0's initial weights
  std::vector<float> pushed(size_t(own.count)), answer(size_t(own.count + 1));
  TrainSummary sum;
  sum.params = layout.param_count();
  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    // Every worker's push, in worker order (Note [Parameter server]).
    for (int w = 0; w < workers; ++w) {
      all.recv(w == 0 ? g : std::span<float>(pushed), w, parallel::ps_tag(step));
      if (w > 0) std::transform(g.begin(), g.end(), pushed.begin(), g.begin(), std::plus<float>());
    }
    const float inv = 1.0f / float(workers);
    for (float& x : g) x *= inv;
    double norm_sq[1] = {sum_squares(k, mean.data(), {own})};
    peers->all_reduce(std::span<double>(norm_sq, 1), comm::ReduceOp::kSum);
    const double norm = std::sqrt(norm_sq[0]);
    if (const double coef = clip_coef(norm, cfg.optim.grad_clip); coef != 1.0)
      k.scale_inplace(g.data(), own.count, float(coef));
    adamw.step(k, params, mean, lr_at(cfg.optim, step, cfg.train.steps));
    std::copy(p.begin(), p.end(), answer.begin());
    answer.back() = float(norm_sq[0]);
    for (int w = 0; w < workers; ++w) all.send(std::span<const float>(answer), w, parallel::ps_tag(step));
  }
  return sum;
}

}  // namespace loom
