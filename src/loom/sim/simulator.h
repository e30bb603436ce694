// The simulator: replays the engine's pipeline schedule (parallel/schedule.h) with the
// cost model's times on every pipeline rank and reports step time, bubble, MFU and HFU,
// throughput and per-rank peak memory (Note [Simulated step]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/sim/cluster.h"
#include "loom/sim/memory_model.h"

namespace loom::sim {

// Which software runs the plan: loom's engine (dtype of the cluster, no dropout, its own
// activation layout from model/layout.h) or a GPU framework (fp16/bf16 mixed precision,
// dropout, the Korthikanti activation set): Megatron-LM / Megatron-core (ZeRO 0-1: its
// distributed optimizer), PyTorch FSDP and FSDP-like stacks (ZeRO 0, 2, 3), or DeepSpeed
// as released in 2021 (ZeRO 0-3; Note [Sharding implementations] in sim/zero_cost.cc).
enum class Framework { kMegatron, kLoom, kFsdp, kDeepSpeed2021 };

const char* framework_name(Framework f);  // "megatron", "loom", "fsdp", "deepspeed-2021"
// The framework named `name`, or ConfigError naming the valid ones.
Framework parse_framework(const std::string& name);
// The ZeRO stages `f` implements, and the frameworks that implement stage `zero` (for errors).
std::vector<int64_t> framework_zero_stages(Framework f);
std::string frameworks_with_zero(int64_t zero);

struct SimPlan {
  Framework framework = Framework::kMegatron;
  Config cfg;                // model, train.batch (global), train.grad_accum, train.seq, parallel.*
  int64_t cp = 1;            // context parallel (simulator and planner only)
  bool dp_overlap = true;    // gradient reduction overlapped with the last backward (loom, torch DDP)
  // Megatron's attention kernel (Note [Fused attention kernels]): unfused (Megatron-LM
  // 2021-22), FlashAttention-2, or a Hopper kernel (Megatron-core with Transformer Engine).
  Attention attention = Attention::kUnfused;
  bool blocking_p2p = false; // a pipeline send holds its rank until delivered (Megatron-LM's
                             // batched isend/irecv + wait); loom's sends are asynchronous
  bool tp_overlap = false;   // Note [Tensor-parallel overlap] (Megatron-core --tp-comm-overlap)
  bool param_gather_overlap = false;  // Note [Parameter-gather overlap] (--overlap-param-gather)
  // Note [Backward prefetch] (sim/zero_cost.cc): FSDP's BACKWARD_POST, the next unit's gather
  // issued after the current unit's gradients (Composer's default); false: BACKWARD_PRE.
  bool backward_prefetch_post = false;
  // Note [Recompute] (model/model.cc): a fully recomputed block stops before the MLP's output
  // projection, as PyTorch's non-reentrant checkpoint does from torch 2.1 on (--framework fsdp);
  // loom's engine always does, the other frameworks recompute the whole block.
  bool recompute_early_stop = false;
  // Note [fp8 GEMMs] (sim/costs.cc): the blocks' linear layers in bf16 or an fp8 format.
  GemmFormat gemm_format = GemmFormat::kBf16;
  // Note [Activation offload] (sim/offload_cost.cc): Megatron's --cpu-offloading-num-layers, the
  // first N layers' saved activations kept in host memory between their passes.
  int64_t activation_offload_layers = 0;
  // Note [fp8 weights under ZeRO-3] (sim/costs.cc): ZeRO-3 gathers the weights' fp8 values
  // (Megatron's --fp8-param-gather, FSDP2's float8 all-gather), not the bf16 ones.
  bool fp8_param_gather = false;
  int64_t gpus() const { return cfg.parallel.ranks() * cp; }  // parameter servers take a device slot each
};

// The simulator holds context parallelism as SimPlan::cp: a config's parallel.cp (what the
// engine trains) moves there. Throws ConfigError when the plan already names another cp.
void take_context_parallel(SimPlan& plan);

// One span of the timeline (Note [Trace schema] of train/trace.h: tid 0 compute, 1 comm).
struct SimEvent {
  int64_t rank = 0;          // global rank (dp 0, tp 0, cp 0 of its pipeline rank)
  int tid = 0;
  std::string name, cat;
  double t0_s = 0, t1_s = 0;
};

struct RankReport {
  int64_t pp_rank = 0, global_rank = 0;
  double params = 0;             // parameters this rank holds before ZeRO sharding
  MemoryBreakdown memory;        // at the peak
  double pipeline_end_s = 0;     // end of its last backward
  double busy_s = 0;             // compute inside the pipeline phase
  double dp_exposed_s = 0, optimizer_s = 0, tied_s = 0, param_gather_s = 0;
  double ps_s = 0;  // Note [Simulated parameter server]: push, the servers' update, pull
  double offload_io_s = 0;       // Note [Optimizer offload]: moment traffic (inside optimizer_s)
  // Note [Chunk manager]: parameter bytes read from the offload tier per step, their time,
  // and the part of it the pipeline's compute does not hide.
  double param_read_bytes = 0, param_read_s = 0, param_fetch_exposed_s = 0;
  double grad_spill_bytes = 0;  // Note [Gradient chunks]: gradient bytes written per step (exposed, with their reads)
  double step_end_s = 0;
  // Note [Measured bubble]: where the update runs inside the stream (2bw's steady step), the
  // end of its "U" span, which counts as busy in the bubble and the floor; 0 elsewhere.
  double update_end_s = 0;
  double bubble_busy_s() const { return busy_s + (update_end_s > 0 ? optimizer_s : 0); }
  double bubble_end_s() const { return update_end_s > 0 ? update_end_s : pipeline_end_s; }
  std::vector<int> chunk_in_flight;  // per chunk: most micro-batches held at once in the replay
};

struct Breakdown {  // seconds of the slowest rank's step
  double compute = 0, recompute = 0, tp_comm = 0, cp_comm = 0, zero_comm = 0;
  double pp_idle = 0, dp_exposed = 0, optimizer = 0, param_fetch = 0;
  double vocab_comm = 0;  // parallel.pp_vocab's collectives (Note [Vocabulary passes])
};

struct SimResult {
  double step_time_s = 0, tokens_per_s = 0;
  double model_flops = 0, hardware_flops = 0;   // per step, all GPUs
  double tflops_per_gpu = 0;                    // model FLOPs (the MFU numerator) / s / GPU
  double mfu = 0, hfu = 0, bubble_fraction = 0;
  double bubble_floor = 0;                      // Note [Bubble floor]
  double peak_memory_bytes = 0;                 // worst rank
  int64_t peak_rank = 0;
  int64_t gpus = 0, micro_batch = 0, micro_batches = 0;
  Breakdown breakdown;
  std::vector<RankReport> ranks;                // one per pipeline rank
  std::vector<SimEvent> events;                 // when asked for
  std::vector<std::string> warnings;            // e.g. a rank over device memory
  // Note [Synchronous warm-up] (parallel/schedule.h): a stream schedule's first
  // warmup_steps steps flush after each; step_time_s prices the steady stream, this a
  // warm-up step (the flushing 1F1B step of the same micro-batches). 0 without warm-up.
  int64_t warmup_steps = 0;
  double warmup_step_time_s = 0;
};

// What one block costs per recompute policy (index = Recompute), for the planner's
// stage DP and per-layer integer program: fwd + bwd seconds per micro-batch (recompute
// included), bytes kept per micro-batch; the embedding's and the head's fwd + bwd; and per
// pipeline rank the micro-batch chunks its schedule holds at once.
struct BlockCosts {
  double time_s[3] = {0, 0, 0}, act_bytes[3] = {0, 0, 0};
  // ZeRO-2/3 traffic the layer's compute does not hide, per micro-batch: parameters
  // gathered per use (shard) or once per step (keep, parallel.zero_keep); and the bytes a
  // kept layer's gathered copy holds.
  double zero_shard_s[3] = {0, 0, 0}, zero_keep_s[3] = {0, 0, 0};
  double unit_bytes = 0;
  double embed_s = 0, head_s = 0;
  std::vector<int> in_flight;
};
BlockCosts block_costs(const SimPlan& plan, const ClusterSpec& cluster);

// Each op of one block, the embedding and the head, per micro-batch on this layout's shapes:
// the forward and backward seconds the cost model charges it (its collectives included) —
// what `loom simulate --ops` prints beside the engine's LOOM_KERNEL_PROFILE.
struct OpCost {
  std::string unit, name;
  double fwd_s = 0, bwd_s = 0;
};
std::vector<OpCost> op_costs(const SimPlan& plan, const ClusterSpec& cluster);

// Throws ConfigError when the plan does not fit the cluster (world != devices, memory is
// only reported, not refused: the planner prunes on it).
SimResult simulate(const SimPlan& plan, const ClusterSpec& cluster, bool record_events = false);

// Note [Bubble floor]
// The bubble no schedule of this stage split can go below: every rank's window in a step is
// at least the busiest rank's work (in a flushing step all start together and the busiest
// must fit its work before the end; a stream runs at the busiest stage's pace), so
//   bubble >= 1 - sum_r busy_r / (p x max_r busy_r),
// busy_r: the rank's pipeline steps, and its update where that runs inside the stream (2bw:
// Note [Measured bubble] in cli/compare_cmd.cc).
// E.g. stages of 4 and 5 s: 1 - 9 / 10 = 10%, whatever the schedule; even stages: 0. What a
// schedule can remove is the bubble above it (its ramp, its dependencies' waits); what is
// left at the floor takes another stage split (parallel.layer_split) to remove. loom compare
// reports it from a trace by the same formula.
inline double bubble_floor(double busy_sum, double busy_max, double ranks) {
  return busy_max > 0 ? 1.0 - busy_sum / (ranks * busy_max) : 0.0;
}

}  // namespace loom::sim
