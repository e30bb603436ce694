#include "loom/sim/zero_cost.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom::sim {

// Note [Sharding implementations]
// ZeRO-3 moves the same bytes in every framework (per layer and micro-batch: its
// parameters gathered in forward and again in backward, its gradients reduce-scattered);
// what differs is how many collectives carry them and whether compute hides them.
//
// Coalesced and prefetched (loom's engine, PyTorch FSDP, FSDP-like stacks such as
// MaxText): a layer's parameters are one flat buffer, moved by one all-gather per pass and
// one reduce-scatter, issued ahead of the layer on their own stream (FSDP's backward
// prefetch; in forward the host runs ahead of the device). A layer is charged what its
// compute C cannot hide and the compute the collectives slow (Note [Overlap contention]):
//   fwd = overlapped(AG, C_fwd),   bwd = overlapped(RS + AG, C_bwd),
// C_bwd including a checkpointed layer's recomputed forward (the prefetch of the next layer is
// issued when the layer's recompute acquires its parameters, in FSDP and in loom's engine).
//
// DeepSpeed ZeRO-3 as released in 2021 (deepspeed/runtime/zero/stage3.py and
// partition_parameters.py of that year, the implementation Narayanan et al. (SC'21) measured
// in their Table 2):
//  (a) one collective per parameter tensor. A module's pre-forward hook gathers each of its
//      tensors of at least stage3_param_persistence_threshold elements (DeepSpeed's default
//      1e5; smaller ones, biases and norms, stay whole on every rank), its post-forward hook
//      releases them, its pre-backward hook gathers them again; a checkpointed layer's
//      recomputed forward runs the forward hooks once more, so full recompute gathers three
//      times per step. Every tensor's gradient, small ones included, is reduce-scattered
//      on its own (_reduce_scatter_gradient).
//  (b) both use torch.distributed's list form (a list of n per-rank views), which
//      ProcessGroupNCCL runs as one NCCL collective plus one copy per rank between the list
//      and a flat buffer (c10d's allgather / reduce_scatter before _allgather_base): n kernel
//      launches per tensor per collective, at the device's per-kernel overhead k, and the
//      copies' 2 x bytes of memory traffic:  L(op, b) = op(b) + n k + mem(2 b).
//  (c) _allgather_param calls torch.cuda.synchronize() before each gather, draining every
//      stream: a gather can overlap only the compute queued after it (the one-bucket
//      prefetch), never a reduce-scatter or an earlier layer; priced as overlapping nothing
//      (an upper bound on its cost; Table 2's step times, which stop falling as the GPUs
//      double, show little overlap):
//   fwd = sum_big L(AG, b_t),   bwd = (1 + [full recompute]) sum_big L(AG, b_t) + sum_all L(RS, b_t).
// At a fixed global batch the compute per GPU halves as n doubles while every tensor still
// costs n launches and a ring of n - 1 hops: the reason Table 2's ZeRO-3 throughput per GPU
// falls with each doubling of GPUs. ZeRO-1/2 under deepspeed-2021 are priced as the
// coalesced reduction (its stage-2 code buckets gradients), not checked against a published run.
//
// Note [Backward prefetch]
// PyTorch FSDP chooses when backward gathers the next unit (torch.distributed.fsdp.
// BackwardPrefetch). BACKWARD_PRE, torch's default and loom's engine's (ParamGather::acquire
// prefetches the next unit as it takes the current one): issued before the current unit's
// gradient computation, so it hides under it, as above. BACKWARD_POST: issued after it, so
// "the next all-gather overlaps the current reduce-scatter" (the FSDP API docs), not compute.
// The two are issued together when the unit's gradients are done and move their bytes over the
// same NVLink and NICs; priced as sharing them evenly while both run (assumed), so the gather
// is through after AG + min(AG, RS), the next unit's backward waits for it, and what is left
// of the reduce-scatter hides under that unit's compute:
//   bwd = AG + min(AG, RS) + overlapped(RS - min(AG, RS), C_bwd).
// (torch's ProcessGroupNCCL queues a group's collectives on one stream, so the two may run in
// turn instead; with the reduce-scatter first that costs AG + RS, the same when the two are
// equal, as in the rows below.)
// Composer, and so llm-foundry, defaulted to it (composer/trainer/dist_strategy.py of 2023:
// fsdp_config.get('backward_prefetch', 'BACKWARD_POST'); llm-foundry's benchmark yamls leave it
// unset). The sharing is what llm-foundry's H100 rows at few tokens a micro-batch showed: with
// the gather priced alone (AG + overlapped(RS, C_bwd)) the rows whose collectives are a large
// share of each micro-batch were 9-20% too fast (MPT-30B and -70B at 4-8k tokens a micro-batch,
// MPT-13B at 4k), those at 40k+ within 1% (docs/log/benchmarks.md, 2026-12-04).
//
// Megatron-LM and Megatron-core shard only optimizer state (--use-distributed-optimizer,
// ZeRO-1); ZeRO-2/3 there are refused rather than priced as something Megatron never ran.

namespace {

constexpr double kPersistenceThreshold = 1e5;  // DeepSpeed stage3_param_persistence_threshold default

// ZeRO-3's gathers of `params` parameters in backward: as forward's (`forward_s`), or under
// hpZ (Note [hpZ]) an fp32 all-gather of the secondary pieces among the dp group's ranks on
// one node.
double backward_gather_s(const Setup& s, double params, double forward_s) {
  if (!s.plan.cfg.parallel.zeropp_hpz) return forward_s;
  GroupShape host = s.pl.dp;
  host.ranks = host.per_node, host.nodes = 1;
  return collective_time_s(s.cluster, OpKind::kAllGather, params * s.wbytes, host);
}

ZeroLayerCost coalesced(const Setup& s, const UnitCost& b, bool keep) {
  const ParallelConfig& par = s.plan.cfg.parallel;
  const double unit = block_params(s.plan.cfg.model, s.tp).per_tp_rank;
  // scatter_bytes 0: a compressed step reduces whole buckets after backward instead.
  const double rs =
      s.scatter_bytes > 0 ? collective_time_s(s.cluster, OpKind::kReduceScatter, unit * s.scatter_bytes, s.pl.dp) : 0;
  const double ag = par.zero >= 3 ? collective_time_s(s.cluster, OpKind::kAllGather, unit * s.gather_bytes, s.pl.dp) : 0;
  ZeroLayerCost z;
  const DeviceSpec& d = s.cluster.device;
  z.fwd = overlapped_s(d, ag, b.fwd.compute) * (keep ? 1.0 / double(s.m) : 1.0);
  const double window = b.bwd.compute + b.recompute.compute, gather = keep ? 0.0 : backward_gather_s(s, unit, ag);
  // Note [Backward prefetch]: under BACKWARD_POST the gather and the reduce-scatter start together
  // and share the links until the shorter of the two is through.
  const double shared = std::min(gather, rs);
  z.bwd = s.plan.backward_prefetch_post ? gather + shared + overlapped_s(d, rs - shared, window)
                                        : overlapped_s(d, rs + gather, window);
  return z;
}

ZeroLayerCost deepspeed_2021(const Setup& s, Recompute r) {
  double gather = 0, scatter = 0;
  for (double t : block_tensors(s.plan.cfg.model, s.tp)) {
    if (t >= kPersistenceThreshold)
      gather += list_collective_s(s.cluster, OpKind::kAllGather, t * s.gather_bytes, s.pl.dp);
    scatter += list_collective_s(s.cluster, OpKind::kReduceScatter, t * s.scatter_bytes, s.pl.dp);
  }
  return {gather, (r == Recompute::kFull ? 2.0 : 1.0) * gather + scatter};
}

std::string stages_text(const std::vector<int64_t>& z) {
  std::string out;
  for (int64_t v : z) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

}  // namespace

double list_collective_s(const ClusterSpec& c, OpKind op, double bytes, const GroupShape& g) {
  if (g.ranks <= 1 || bytes <= 0) return 0;
  return collective_time_s(c, op, bytes, g) + double(g.ranks) * c.device.kernel_overhead_s +
         memory_time_s(c.device, 2 * bytes);
}

ZeroLayerCost zero_layer_cost(const Setup& s, const UnitCost& block, Recompute r, bool keep) {
  const ParallelConfig& par = s.plan.cfg.parallel;
  if (par.zero < 2 || s.dp * s.cp <= 1) return {};
  if (s.plan.framework == Framework::kDeepSpeed2021 && par.zero >= 3) return deepspeed_2021(s, r);
  return coalesced(s, block, keep);
}

const char* framework_name(Framework f) {
  switch (f) {
    case Framework::kMegatron: return "megatron";
    case Framework::kLoom: return "loom";
    case Framework::kFsdp: return "fsdp";
    case Framework::kDeepSpeed2021: return "deepspeed-2021";
  }
  return "?";
}

Framework parse_framework(const std::string& name) {
  for (Framework f : {Framework::kMegatron, Framework::kLoom, Framework::kFsdp, Framework::kDeepSpeed2021})
    if (name == framework_name(f)) return f;
  throw ConfigError("--framework '" + name + "': expected loom, megatron, fsdp or deepspeed-2021");
}

std::vector<int64_t> framework_zero_stages(Framework f) {
  switch (f) {
    case Framework::kMegatron: return {0, 1};
    case Framework::kFsdp: return {0, 2, 3};  // NO_SHARD, SHARD_GRAD_OP, FULL_SHARD
    default: return {0, 1, 2, 3};
  }
}

std::string frameworks_with_zero(int64_t zero) {
  std::string out;
  for (Framework f : {Framework::kLoom, Framework::kMegatron, Framework::kFsdp, Framework::kDeepSpeed2021}) {
    const std::vector<int64_t> z = framework_zero_stages(f);
    if (std::find(z.begin(), z.end(), zero) != z.end())
      out += (out.empty() ? "" : ", ") + std::string(framework_name(f));
  }
  return out;
}

void check_framework_runs(const SimPlan& plan) {
  const ParallelConfig& par = plan.cfg.parallel;
  const std::vector<int64_t> z = framework_zero_stages(plan.framework);
  LOOM_CONFIG_CHECK(std::find(z.begin(), z.end(), par.zero) != z.end(), "parallel.zero = ", par.zero,
                    ": --framework ", framework_name(plan.framework), " runs ZeRO ", stages_text(z),
                    " (Note [Sharding implementations]); ZeRO ", par.zero, " runs under --framework ",
                    frameworks_with_zero(par.zero));
  LOOM_CONFIG_CHECK(!plan.recompute_early_stop || plan.framework == Framework::kFsdp || plan.framework == Framework::kLoom,
                    "--recompute-early-stop is PyTorch's non-reentrant checkpoint from torch 2.1 (Note [Recompute]); "
                    "--framework ", framework_name(plan.framework), " recomputes whole blocks: simulate it with "
                    "--framework fsdp (loom's engine always stops early), or drop it");
  LOOM_CONFIG_CHECK(!plan.backward_prefetch_post || plan.framework == Framework::kFsdp,
                    "--backward-prefetch post is PyTorch FSDP's BACKWARD_POST (Note [Backward prefetch]); --framework ",
                    framework_name(plan.framework), " gathers as it does: simulate it with --framework fsdp, or drop it");
  if (plan.framework != Framework::kDeepSpeed2021) return;
  LOOM_CONFIG_CHECK(par.zero_keep.empty() && !par.zeropp_qwz && !par.zeropp_qgz && !par.zeropp_hpz,
                    "parallel.zero_keep and ZeRO++ (zeropp_qwz, zeropp_qgz, zeropp_hpz) are not in DeepSpeed's 2021 "
                    "ZeRO-3; drop them, or simulate them with --framework loom");
}

}  // namespace loom::sim
