// The Updater's side of a parameter-server worker (Note [Parameter server] in
// modes/ps/ps.h): push the gradients, pull the weights.
#include <chrono>
#include <thread>

#include "loom/engine/engine.h"
#include "loom/modes/ps/ps.h"
#include "loom/train/rank_context.h"

namespace loom {

// Note [Parameter server]: under sync the workers' mean loss; the servers average the
// gradients, clip by their global norm and update; the pull brings the new weights and that
// norm. Under async / ssp (Note [Asynchronous parameter server]) this replica's own loss and
// norm; the servers may answer "stop" (the run's pushes are done), which the replica's ranks
// agree on (Note [Parameter server with model parallelism]). ps.slow_worker sleeps
// (slow_factor - 1) x the time since the last answer first (a straggler for benchmarks).
Updater::Result Updater::step_ps(double local_loss, double, int64_t step, bool) {
  Result r;
  const RankContext& rc = e_.rc;
  const bool free = cfg_.ps.free_running();
  const std::vector<float>& g = e_.model.grads();
  // The loss over the workers (sync) or the replica; each replica's tp ranks hold one copy.
  double v[2] = {local_loss, free ? sum_squares(e_.model.ops(), g.data(), norm_ranges_) : 0.0};
  if (!free) rc.stats_sum(v);
  else if (rc.ps_replica) rc.ps_replica->all_reduce(std::span<double>(v, 2), comm::ReduceOp::kSum);
  r.loss = v[0] / ((free ? 1 : rc.dp_size) * rc.tp_size);
  if (rc.dp_rank == cfg_.ps.slow_worker)
    std::this_thread::sleep_for((std::chrono::steady_clock::now() - ps_answered_) * (cfg_.ps.slow_factor - 1.0));
  const parallel::PsReply reply = ps_->push_pull(g.data(), e_.model.params().data(), step, v[1]);
  ps_answered_ = std::chrono::steady_clock::now();
  r.norm = reply.norm;
  if (!free) return r;
  double stop[1] = {reply.stop ? 1.0 : 0.0};
  if (rc.ps_replica) rc.ps_replica->all_reduce(std::span<double>(stop, 1), comm::ReduceOp::kMax);
  r.stop = stop[0] != 0;
  if (r.stop) ps_->bye();
  if (rc.embed) {  // the last stage's tied wte copy: the first stage's
    const ParamSpec& w = e_.model.layout().at("wte");
    rc.embed->broadcast(std::span<float>(e_.model.params().data() + w.offset, size_t(w.numel)), 0);
  }
  return r;
}

}  // namespace loom
