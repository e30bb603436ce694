// Cluster specs for the simulator and planner: devices, memory, links per tier.
//
// A spec is TOML (configs/clusters/*.toml, compiled in as presets; `local` is written by
// `loom calibrate`). Resolution: preset or file < --set cluster.key=value < --gpus N.
// Every value is checked once; unknown keys and impossible values are errors naming the
// key, the value and the expected form.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::sim {

// A piecewise curve over a size (FLOPs, bytes): points sorted by x, interpolated linearly
// in log(x), clamped at both ends.
struct Curve {
  std::vector<std::pair<double, double>> points;
  double at(double x) const;
};

// Note [GEMM width] (sim/costs.cc): GEMM efficiency by a linear layer's narrower feature
// count (min of in and out features) and FLOPs: one Curve per measured width, widths
// increasing; between widths interpolated linearly in log(width), clamped at both ends.
struct WidthCurves {
  std::vector<std::pair<double, Curve>> by_width;
  bool empty() const { return by_width.empty(); }
  double at(double width, double flops) const;
};


// Note [Memory-bound kernel classes] (sim/costs.cc): the memory-bound ops a device may
// price by their own measured curves; kGeneric ops take memory_efficiency.
enum class MemClass { kGeneric, kNorm, kActivation, kResidual };
inline constexpr int kMemClasses = 4;

struct DeviceSpec {
  std::string name;
  double peak_flops = 0;          // dense FLOP/s at the training dtype
  // Note [fp8 GEMMs] (sim/costs.cc): dense fp8 FLOP/s (0: no fp8 tensor cores) and the
  // fraction of it one GEMM reaches (empty: gemm_efficiency's fraction).
  double fp8_peak_flops = 0;
  Curve fp8_gemm_efficiency;
  double fp4_peak_flops = 0;  // Note [NVFP4 GEMMs]: dense fp4 FLOP/s (0: no fp4 tensor cores)
  double memory_bytes = 0;
  double memory_bw = 0;           // bytes/s
  int64_t dtype_bytes = 2;        // activations and working weights
  bool mixed_precision = true;    // fp32 master weights beside dtype_bytes params/grads
  Curve gemm_efficiency;          // x: FLOPs of one GEMM -> fraction of peak_flops
  // Note [GEMM width]: a linear layer's GEMM by (its narrower feature count, FLOPs) ->
  // fraction of peak_flops, as `loom calibrate` measures it; empty: gemm_efficiency prices it.
  WidthCurves gemm_width_efficiency;
  Curve memory_efficiency;        // x: bytes moved by one kernel -> fraction of memory_bw
  Curve attention_efficiency;     // x: FLOPs of one fused attention kernel (empty: GEMM roofline)
  // Note [Fused attention kernels]: per flash generation (index 1: FlashAttention-1, 2:
  // FlashAttention-2, 3: the Hopper kernels), x: sequence length -> fraction of peak of a
  // causal forward + backward (head dim 128). Empty: the next older generation's curve,
  // and below flash1 the GEMM roofline.
  Curve flash_efficiency[4];
  double special_function_rate = 0;  // exponentials/s (SFUs); 0: head dims priced as 128's
  // The Hopper kernels' rate per FLOP at a head dim over their rate at 128 (x: head dim),
  // measured; empty: every head dim as 128's (Note [Fused attention kernels]).
  Curve flash3_head_dim_rate;

  // x: FLOPs of a forward GEMM -> (its backward's time) / (2 x its forward's time), as
  // measured by `loom calibrate` (loom's backward kernel adds a bias reduction and, in
  // bf16, three operand conversions); empty: 1, the two GEMMs of the same size.
  Curve gemm_backward_factor;
  double kernel_overhead_s = 0;   // added to every kernel
  // Note [Overlap contention] (sim/costs.cc): compute seconds lost per second of a collective
  // that runs beside compute (kappa). 0: an overlapped collective costs compute nothing.
  double overlap_cost = 0;
  // Bytes/s of writing into pages the OS has taken back (read-modify-write, as a gradient
  // accumulates): loom's engine releases the pieces ZeRO-2/3 do not own after each use
  // (Note [Resident memory]), and the next write faults them in zeroed. 0: not modelled.
  double page_fault_bw = 0;
  // Note [Activation offload] (sim/offload_cost.cc): bytes/s each way between the device and its
  // host's memory (Grace-Blackwell's NVLink-C2C); 0: not stated (no activation offload).
  double host_bw = 0;
  // Note [Oversubscribed cores] (sim/cluster.cc): shared devices only; x: ranks per thread
  // (devices_per_node / threads) -> the processor's throughput kept over one rank per core,
  // and the wait every collective costs then, as `loom calibrate` measures them. Empty / 0:
  // ranks beyond the cores cost only their share. load_cluster zeroes the wait where the
  // ranks do not outnumber the threads.
  Curve oversubscription;
  double oversubscribed_sync_s = 0;
  // Note [Machine speed] (sim/calibrate.cc): `loom calibrate`'s fixed GEMM probe, FLOP/s
  // (the fastest of its timings across the calibration). Prices nothing: bench/sim_vs_engine
  // repeats the probe to report how fast the machine ran against the calibration. 0: none.
  double speed_probe_flops = 0;
  bool shared = false;            // the node's devices share one processor (loom ranks on a CPU):
                                  // peak, bandwidth and memory are divided among them
  // Shared devices (Note [Calibration]): the processor's threads, and the curves measured
  // with one thread, as fractions of peak / threads and memory_bw / threads. Ranks that
  // get one thread each (at least `threads` of them) are priced with these: small kernels
  // scale worse over threads, so one-thread ranks get more from a core than 1/threads of
  // the all-thread rate. Empty: the all-thread curves for every rank count.
  int64_t threads = 0;
  Curve gemm_efficiency_1t, attention_efficiency_1t, memory_efficiency_1t;
  WidthCurves gemm_width_efficiency_1t;
  // loom's optimizer pass (gradient norm + AdamW) as measured by `loom calibrate`: x: its
  // bytes (32 per parameter, OptimConfig::update_bytes) -> fraction of memory_bw (of
  // memory_bw / threads for the _1t curve). Empty: the memory-bound curve prices it.
  Curve optimizer_efficiency, optimizer_efficiency_1t;
  // Note [Memory-bound kernel classes], indexed by MemClass (kGeneric unused): x: the
  // forward's bytes as the cost model counts them -> fraction of memory_bw (of memory_bw /
  // threads for _1t), and the backward's time over the forward's. Empty: memory_efficiency,
  // and a backward moving twice the bytes.
  Curve class_efficiency[kMemClasses], class_efficiency_1t[kMemClasses], class_backward[kMemClasses];
};

// The TOML key of a class's curves: "norm", "activation", "residual" (kGeneric: "").
const char* mem_class_key(MemClass c);

struct LinkTier {
  double bw = 0;           // bytes/s per device, one direction
  double latency_s = 0;    // per algorithm step
  double efficiency = 1;   // reachable fraction of bw for large messages
};

// Measured bus bandwidth of one collective at one group size (from `loom calibrate`):
// busbw as nccl-tests defines it, by message bytes. Used instead of the formula when a
// table for the op and size exists.
struct BusbwTable {
  std::string op;     // all_reduce | all_gather | reduce_scatter | p2p
  int64_t ranks = 2;
  Curve gbps;         // x: bytes per rank -> busbw in 1e9 bytes/s
};

// A slower tier for offloaded optimizer state (Note [Optimizer offload] in
// modes/offload/offload.h): a node's NVMe drives, or loom's local disk. Per device: its share of the
// node's drives. read_bw == 0: the cluster has none.
struct OffloadTier {
  double read_bw = 0, write_bw = 0;  // bytes/s
  double capacity_bytes = 0;
  // Through the page cache (a file the kernel holds in memory): the copy rates of pread and
  // pwrite, bytes/s, as loom calibrate measures them; 0 = not measured (Note [Page-cached offload]).
  double cached_read_bw = 0, cached_write_bw = 0;
};

struct ClusterSpec {
  std::string name;
  int64_t nodes = 1, devices_per_node = 1;
  // Note [Partial racks]: > 0 where a job may take part of each node in whole trays of this
  // many devices (an NVL72 rack's compute trays); 0: whole nodes only.
  int64_t tray_devices = 0;
  DeviceSpec device;
  LinkTier intra, inter;
  OffloadTier offload;
  std::vector<BusbwTable> busbw;  // empty unless calibrated
  int64_t devices() const { return nodes * devices_per_node; }
};

// Preset names (dgx-a100, dgx-h100, dgx-b200, gb200-nvl72, gb300-nvl72, dgx-v100, local) and the compiled-in TOML of one.
std::vector<std::string> cluster_preset_names();
const char* cluster_preset_toml(const std::string& name);  // nullptr if not compiled in

// `source`: a preset name, "local" (read from `local_path`), or a path to a .toml file.
// `sets`: "cluster.key=value" or "cluster.section.key=value". `gpus` > 0 sets nodes =
// gpus / devices_per_node (or one node of `gpus` devices when fewer than a node; with
// tray_devices, the fewest nodes that hold `gpus` evenly in whole trays, Note [Partial racks]).
// Throws ConfigError naming the problem.
ClusterSpec load_cluster(const std::string& source, const std::vector<std::string>& sets, int64_t gpus,
                         const std::string& local_path);
// The file `source` is read from ("" for a compiled-in preset or an unknown name).
std::string cluster_file_path(const std::string& source, const std::string& local_path);
ClusterSpec cluster_from_toml(const std::string& text, const std::string& origin,
                              const std::vector<std::string>& sets = {});

// The spec as TOML (what `loom calibrate` writes; round-trips through cluster_from_toml).
std::string cluster_to_toml(const ClusterSpec& c);

// Note [Stack efficiency] (sim/published.cc): the cluster's GEMMs and attention at f of their
// rate (its peak; memory-bound kernels and links keep theirs), said in its name.
// ConfigError unless 0 < f <= 1.
void scale_compute_rate(ClusterSpec& c, double f);

}  // namespace loom::sim
