// The Updater's side of a parameter-server worker (Note [Parameter server] in
// modes/ps/ps.h): push the gradients, pull the weights.
#include <chrono>
#include <thread>

#include "loom/engine/engine.h"
#include "loom/modes/ps/ps.h"

namespace loom {

// Note [Parameter server]: under sync the workers' mean loss; the servers average the
// gradients, clip by their global norm and update; the pull brings the new weights and that
// norm. Under async / ssp (Note [Asynchronous parameter server]) this worker's own loss and
// norm; the servers may answer "stop" (the run's pushes are done). ps.slow_worker sleeps
// (slow_factor - 1) x the time since the last answer first (a straggler for benchmarks).
Updater::Result Updater::step_ps(double local_loss, double, int64_t step, bool) {
  Result r;
  const bool free = cfg_.ps.free_running();
  double v[2] = {local_loss, 0};
  if (!free) e_.rc.stats_sum(v);
  r.loss = free ? local_loss : v[0] / e_.rc.dp_size;
  if (e_.rc.dp_rank == cfg_.ps.slow_worker)
    std::this_thread::sleep_for((std::chrono::steady_clock::now() - ps_answered_) * (cfg_.ps.slow_factor - 1.0));
  const std::vector<float>& g = e_.model.grads();
  const double norm_sq = free ? sum_squares(e_.model.ops(), g.data(), {{0, int64_t(g.size())}}) : 0.0;
  const parallel::PsReply reply = ps_->push_pull(g.data(), e_.model.params().data(), step, norm_sq);
  ps_answered_ = std::chrono::steady_clock::now();
  r.norm = reply.norm;
  r.stop = free && reply.stop;
  return r;
}

}  // namespace loom
