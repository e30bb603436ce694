// `loom calibrate`: measures this machine into a cluster spec (`--cluster local`): loom's
// own kernels' rates by size (GEMM, fused attention, memory-bound kernels), the launch
// overhead, and collective bus bandwidth per op and rank count (Note [Calibration]).
#pragma once

#include <functional>
#include <string>

#include "loom/sim/cluster.h"

namespace loom {

struct Kernels;

struct CalibrateOptions {
  int threads = 0;            // OpenMP/BLAS threads for the kernel timings; 0: all cores
  std::vector<int> ranks = {2, 4};
  double seconds_per_point = 0.05;
  int oversubscription_passes = 15;  // Note [Oversubscribed cores]: each figure a median of this many
  int passes = 3;             // kernel timings repeated, interleaved; each rate its fastest, each ratio the median (Note [Calibration])
  std::function<void(const std::string&)> progress;  // one line per measured table
  // bf16: the GEMM curve and peak are loom's bf16 linear kernel (conversions included), as
  // train.precision = bf16 runs it; everything else stays fp32, as in that engine. The
  // spec is then named "local-bf16".
  bool bf16 = false;
  // A directory on the disk offload files would use: its read and write rates and free bytes
  // become the spec's [offload] tier (empty, or not a writable directory: no tier).
  std::string offload_dir;
};

// The machine as one node whose devices are loom ranks sharing its cores (device.shared).
sim::ClusterSpec calibrate_local(const CalibrateOptions& o);
// The [offload] tier an offload file under `dir` would see: the disk's O_DIRECT read and
// write rates and the file system's free bytes; zeros where `dir` takes no such file.
sim::OffloadTier measure_offload_tier(const std::string& dir);
// Note [Overlap contention]: compute seconds a rank loses per second of collective its group's
// worker runs beside it, ranks filling the cores (0 on one core); OpenBLAS is left at
// `threads_after` threads.
double measure_overlap_cost(const Kernels& k, int passes, int threads_after);
// Note [Oversubscribed cores] (sim/cluster.cc): `kept`, x: one-thread ranks per core (1, 2, 4)
// -> the processor's throughput over one rank per core; `sync_s`, the wait one
// synchronisation costs at two ranks a core. Empty / 0 below two cores. OpenBLAS is left at
// `threads_after` threads.
struct Oversubscription {
  sim::Curve kept;
  double sync_s = 0;
};
Oversubscription measure_oversubscription(const Kernels& k, int cores, int passes, int threads_after);
// Note [Machine speed] (calibrate.cc): a fixed fp32 GEMM's median rate on `threads`
// threads, FLOP/s; OpenMP and OpenBLAS are left at `threads`.
double speed_probe_flops(int threads);

}  // namespace loom
