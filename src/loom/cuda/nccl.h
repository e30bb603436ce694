// Note [GPU data parallelism]
// train.device = cuda with parallel.dp = D > 1 runs D processes (mpirun, or --nproc D), one
// GPU each: every rank holds the whole model, reads its 1/D of each global batch
// (DataLoader shard = its rank), and after the last micro-batch's backward the fp32
// gradients are summed over the ranks by one NCCL all-reduce on the compute stream, the
// micro-batch losses having been scaled by 1 / (accum D) so the sum is the global mean's
// gradient. Clipping and AdamW then run on identical gradients, so the parameters stay
// identical (rank 0's initial parameters are broadcast once, so a resume or init that
// differs by rank cannot split them). Losses and validation losses are averaged over the
// ranks on the host (comm::Group, MPI); rank 0 writes the checkpoints, the others wait.
//
// NCCL is bootstrapped over the host group (rank 0's unique id broadcast over MPI) and
// runs non-blocking: every wait polls NCCL's error state and the stream with the run's
// comm.timeout_s, and on a failure or timeout aborts the communicator and throws
// CommError naming the collective, so a dead or hung peer never leaves a rank waiting
// forever. NCCL refuses two ranks on one GPU, so a host with fewer GPUs than ranks is
// refused up front (gpu_for_rank).
//
// Tested: the communicator on one rank (one GPU: its collectives are copies), the GPU
// assignment and refusals. Two or more GPUs were not available; the multi-rank run waits
// for a multi-GPU machine (bench/cuda_device.sh dp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::comm {
class Group;
}

namespace loom::cuda {

// The GPU global rank `rank` drives: its index among the ranks on its host (hosts[r] is
// rank r's host name). Throws ConfigError naming the host and the counts when that host
// has fewer than that many GPUs (NCCL runs one rank per GPU).
int gpu_for_rank(const std::vector<std::string>& hosts, int rank, int device_count);

// True when this build has NCCL's header and libnccl.so.2 loads (multi-GPU training);
// without it dp > 1 is refused.
bool nccl_available();

// A NCCL communicator over the members of a host group, on the current device.
class Nccl {
 public:
  // Collective over `group`. timeout_s bounds every wait (> 0).
  Nccl(comm::Group& group, double timeout_s);
  ~Nccl();
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

  int size() const { return size_; }
  int rank() const { return rank_; }
  // In place on the device, enqueued on `stream` (a cudaStream_t): data <- sum over ranks.
  void all_reduce_sum(float* data, int64_t n, void* stream);
  void all_reduce_sum(double* data, int64_t n, void* stream);
  // In place: data <- rank `root`'s data.
  void broadcast(float* data, int64_t n, int root, void* stream);
  // Returns once `stream`'s work so far has finished; throws CommError naming `what` when
  // NCCL reports an error or the work has not finished within the timeout (the
  // communicator is aborted first, so no kernel is left waiting for a peer).
  void wait(void* stream, const std::string& what);

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
  int size_ = 1, rank_ = 0;
};

}  // namespace loom::cuda
