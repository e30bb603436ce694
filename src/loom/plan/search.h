// `loom plan`: the parallel space searched with the simulator, stage splits from the
// stage DP and per-layer recompute from the integer program (Note [Plan search]).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/sim/simulator.h"

namespace loom::plan {

struct PlanRequest {
  // What every candidate shares: the model and sequence (cfg; its layout fields are
  // searched) and how the framework runs (framework, overlap, blocking p2p, flash attention).
  sim::SimPlan like;
  sim::ClusterSpec cluster;    // devices() GPUs
  int64_t global_batch = 0;
  int64_t top = 5;
  std::vector<int64_t> cp = {1};
  bool refine = true;          // stage DP + per-layer ILP on the best uniform plans
  // Gradient compressors tried besides exact sync (Note [Gradient compressors]; zero 0/1,
  // dp > 1, with like.cfg.parallel's compress_* parameters): only where the dp group
  // crosses nodes (the slow links), or everywhere with compress_everywhere.
  std::vector<CompressKind> compress;
  bool compress_everywhere = false;
  // ZeRO++ tried on the same dp groups: qgZ for ZeRO-2; qwZ + qgZ, hpZ, and all three for
  // ZeRO-3 (Note [bf16 parameter gathers], [qgZ], [hpZ] in parallel/).
  bool zeropp = false;
  // A layout that does not fit device memory is tried again with its AdamW moments offloaded
  // (Note [Optimizer offload]) when the cluster has an offload tier; the plan's
  // offload.dir is this (an existing directory on the tier).
  bool offload = true;
  std::string offload_dir = "/var/tmp";
  // Parameter-server layouts (Note [Parameter server]) tried besides collective ones: S = 1,
  // 2, 4, ... < devices servers taking device slots, the rest dp workers (tp = pp = 1, zero 0,
  // ps.mode sync), with sparse embedding rows when ps_sparse (a Llama).
  bool ps = false, ps_sparse = false;
};

struct PlanCandidate {
  sim::SimPlan plan;
  sim::SimResult result;
  std::string how;             // "uniform", "stage DP", "per-layer ILP"
};

struct PlanReport {
  std::vector<PlanCandidate> ranked;             // fastest first, all fit in memory
  std::map<std::string, int64_t> pruned;         // reason -> count
  std::map<std::string, std::string> example;    // reason -> one layout it pruned
  int64_t evaluated = 0, ilp_solves = 0;
  double ilp_s = 0, total_s = 0;
};

PlanReport search_plans(const PlanRequest& req);

// "dp 16 tp 8 pp 8 vpp 3 sp zero 1 mb 1 x 96 interleaved recompute selective"
std::string layout_label(const sim::SimPlan& p);
// The label with a per-layer recompute that is the same everywhere written as that policy:
// equal keys are one layout (the ranking lists each once).
std::string layout_key(const sim::SimPlan& p);
// The interleaving degrees the search tries for `layers` on `pp` stages: vpp 2..4 (the stage
// split may be uneven) and every larger vpp giving each virtual stage the same whole number
// of layers (96 layers, pp 8: 2, 3, 4, 6, 12); never more virtual stages than layers.
std::vector<int64_t> interleave_degrees(int64_t layers, int64_t pp);
// "" for exact training; else what the plan trades away (a compressor and its parameters,
// or 2bw's delayed updates) and that its accuracy cost is not modelled, and what of it only
// the simulator runs (engine_refusal).
std::string approximation_caveat(const sim::SimPlan& p);
// "" when loom's engine runs the plan as planned; else what it does not run yet (cp > 1,
// an fp8 format), in words.
std::string engine_refusal(const sim::SimPlan& p);
// What the search ranks by: the mean step over the run's train.steps, the steady step but
// for a stream schedule's synchronous warm-up, whose flushing steps cost more (Note
// [Synchronous warm-up]).
double run_step_s(const PlanCandidate& c);
// A loom config TOML `loom train --plan FILE` runs (ConfigError naming engine_refusal's
// reason when the engine would not run the plan as planned), and the equivalent
// Megatron-LM flags.
std::string emit_loom_toml(const sim::SimPlan& p);
std::string emit_megatron_args(const sim::SimPlan& p);

}  // namespace loom::plan
