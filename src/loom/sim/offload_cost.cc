// Pricing offload's transfers (Note [Page-cached offload]), parameter offload's chunks
// (Note [Chunk manager], Note [ZeRO-3 offload], Note [Replicated-parameter offload]) and the
// GPU frameworks' activation offload (Note [Activation offload]).
#include <algorithm>

#include "loom/core/error.h"
#include "loom/sim/replay.h"

namespace loom::sim {

// Note [Activation offload]
// Megatron-core's CPU offloading (--cpu-offloading-num-layers N, Transformer Engine's offload
// context): the activations the first N layers save for backward are copied to host memory as
// their forward ends and copied back ahead of their backward, so the device holds the other
// layers' and one offloaded layer's in transit. NVIDIA's Grace-Blackwell recipes use it in
// place of recompute (Megatron-Bridge's Llama 3 70B GB300 presets offload 20-30 layers under
// Megatron-FSDP). Each copy overlaps the next layer's pass (the copy engines, not the SMs), so
// a layer's copy costs only what its bytes over the host link (device.host_gbps each way)
// outlast its own forward or backward; that excess is priced into the pass as compute time.
// Megatron-core's TransformerConfig refuses it with pipeline parallelism, with recompute and for
// N >= layers, and so does the simulator.
void check_activation_offload(const SimPlan& plan, const ClusterSpec& cluster) {
  const int64_t n = plan.activation_offload_layers;
  if (n == 0) return;
  const ParallelConfig& par = plan.cfg.parallel;
  LOOM_CONFIG_CHECK(n > 0 && n < plan.cfg.model.layers, "--activation-offload ", n, ": expected 0 to model.layers - 1 (",
                    plan.cfg.model.layers - 1, "; Megatron-core keeps the last layer's on the device)");
  LOOM_CONFIG_CHECK(plan.framework != Framework::kLoom, "--activation-offload prices Megatron-core's CPU offloading; "
                    "loom's engine does not offload activations (use --framework megatron or fsdp)");
  LOOM_CONFIG_CHECK(par.pp == 1, "--activation-offload with pp ", par.pp, ": Megatron-core offloads activations only "
                    "without pipeline parallelism; set --pp 1 or drop it");
  for (Recompute r : par.recompute_layers(plan.cfg.model.layers))
    LOOM_CONFIG_CHECK(r == Recompute::kNone, "--activation-offload with recompute ", recompute_text(par.recompute),
                      ": Megatron-core offloads in place of recomputing; set --recompute none or drop it");
  LOOM_CONFIG_CHECK(cluster.device.host_bw > 0, "--activation-offload: device ", cluster.device.name, " of cluster ",
                    cluster.name, " states no host link (device.host_gbps); set it, e.g. --set "
                    "cluster.device.host_gbps=450 for NVLink-C2C");
}

// Note [Activation offload]: layer `b`'s saved activations leave the device between its passes,
// one offloaded layer's staying resident in transit; the copies' excess over its passes.
void offload_layer(const Setup& s, ChunkCost& ch, const UnitCost& b) {
  const double copy = b.act_bytes / s.cluster.device.host_bw;
  ch.fwd.compute += std::max(0.0, copy - b.fwd.total());
  ch.bwd.compute += std::max(0.0, copy - b.bwd.total());
  ch.act_bytes -= b.act_bytes;
  ch.offload_buffer = std::max(ch.offload_buffer, b.act_bytes);
}

// Note [Page-cached offload]
// On a calibrated CPU (a shared device) the offload file lives in the page cache whenever it
// fits beside the rank's memory: its transfers are then the kernel's copies between the
// cache and the engine's buffers, at the rates loom calibrate measures through the page
// cache (offload.cached_read_gbps / cached_write_gbps; memory speed where a spec lacks them),
// and reading into pages the engine handed back faults them in (page_fault_bw). Those copies
// run on the cores the compute threads use, so they add to the step instead of hiding under
// the update (measured on this VM: the moments' copies of configs A and B at 12 and 8 GB/s
// cost 5.3 and 10.6 ms, and the offloaded steps were 4.2 and 11.5 ms slower than in memory).
// The offload tier's rates apply otherwise, and always on GPU clusters (their host memory is
// not the device's), where the transfers overlap the update.

// Seconds of the page cache's copies: `read` bytes out of it and `written` bytes into it.
double cached_copy_s(const Setup& s, double read, double written) {
  const OffloadTier& o = s.cluster.offload;
  if (o.cached_read_bw > 0 && o.cached_write_bw > 0) return read / o.cached_read_bw + written / o.cached_write_bw;
  return memory_time_s(s.cluster.device, read) + memory_time_s(s.cluster.device, written);
}

bool page_cached(const Setup& s, const RankReport& rep) {
  const Config& cfg = s.plan.cfg;
  if (!s.cluster.device.shared || s.cluster.device.page_fault_bw <= 0) return false;
  const double shards = cfg.parallel.zero >= 1 ? double(s.dp * s.cp) : 1.0;
  const double arrays = 2.0 + (cfg.offload.params == loom::OffloadTier::kDisk) + (cfg.offload.grads == loom::OffloadTier::kDisk);
  return rep.memory.total() + 4 * arrays * rep.params / shards <= s.cluster.device.memory_bytes;
}

// Note [Chunk manager]: the manager may keep K = budget - the rest of the rank's memory
// (budget: memory.limit_gib, at most the device's memory; none: K = 0, as in the engine), and
// holds at least the units in flight (the embedding and two blocks, rounded out to whole
// chunks). Under Belady's MIN each sweep over the units (a forward or a backward of each
// micro-batch: 2 m per step; recompute reuses the unit just read) finds the bytes the last
// one left and reads the others: P - K; the update refreshes what is kept, so K >= P reads
// nothing. The reads run one unit ahead of compute, hidden until they outlast it.
// Note [Gradient chunks]: the gradients draw on the same K, first after the parameters'
// units in flight (the parameters, next needed a step later, give way); a gradient byte that
// does not fit is written once per micro-batch and read back m - 1 times in backward and
// twice at the update, on the step.
// Note [ZeRO-3 offload]: with ZeRO-3 the chunks are the own pieces (1/dp of every unit); the
// gather pool, kept layers and hpZ's secondary pieces stay beside them, and the engine leaves
// a unit's gradients of slack (their reduce-scatter ends at a varying moment). ZeRO-1/2 read
// as ZeRO 0 does and write the gathered whole back after each update.
void price_param_offload(const Setup& s, RankReport& rep) {
  const Config& cfg = s.plan.cfg;
  MemoryBreakdown& mem = rep.memory;
  const bool grads = cfg.offload.grads == loom::OffloadTier::kDisk, cached = page_cached(s, rep);  // as the optimizer phase saw it
  const bool zero3 = cfg.parallel.zero >= 3 && s.dp * s.cp > 1;
  const double shards = zero3 ? double(s.dp * s.cp) : 1.0;
  const double P = zero3 ? rep.params * s.wbytes / shards : mem.params, G = grads ? mem.grads : 0;
  const double beside = mem.params - P;  // ZeRO-3's pool, kept layers, secondary pieces
  const double budget =
      cfg.memory.limit_gib > 0 ? std::min(s.cluster.device.memory_bytes, cfg.memory.limit_gib * double(int64_t(1) << 30)) : 0;
  const double embedding = double(cfg.model.vocab * cfg.model.d_model) / s.x.vocab_t();
  const double block = block_params(cfg.model, s.tp).per_tp_rank;
  const double least = std::min(P, ((embedding + 2 * block) / shards + 6 * double(cfg.offload.chunk_floats())) * s.wbytes);
  // The engine's slack: 1% of the budget, and with ZeRO-3 a unit's gradients.
  const double K = budget * 0.99 - (zero3 ? 4 * std::max(block, embedding) : 0) - (mem.total() - P - G);
  // The gradients first (after the parameters' units in flight), the parameters what is left.
  const double kept_g = grads ? std::clamp(K - least, std::min(G, least), G) : 0;
  const double kept_p = std::clamp(K - kept_g, 0.0, P), short_g = G - kept_g;
  mem.params = beside + std::max(least, kept_p);
  if (grads) mem.grads = kept_g;
  const double m = double(s.m);
  rep.param_read_bytes = 2 * m * (P - kept_p);
  rep.grad_spill_bytes = m * short_g;
  const double back = (m + 1) * short_g;  // gradient bytes read back
  // Note [Replicated-parameter offload]: ZeRO-1/2 write the gathered whole (fp32) into the
  // parameters' file after each update, on the step.
  const bool replicated = (cfg.parallel.zero == 1 || cfg.parallel.zero == 2) && s.dp * s.cp > 1;
  const double whole = replicated ? 4 * rep.params : 0.0;
  if (cached) {
    // Note [Page-cached offload]: the cache's copies into pages faulted in fresh, on the
    // cores compute uses: nothing hidden.
    const DeviceSpec& d = s.cluster.device;
    rep.param_read_s = cached_copy_s(s, rep.param_read_bytes, 0) + rep.param_read_bytes / d.page_fault_bw;
    rep.param_fetch_exposed_s =
        rep.param_read_s + cached_copy_s(s, back, rep.grad_spill_bytes + whole) + back / d.page_fault_bw;
    return;
  }
  rep.param_read_s = rep.param_read_bytes / s.cluster.offload.read_bw;
  rep.param_fetch_exposed_s = std::max(0.0, rep.param_read_s - rep.busy_s);
  rep.param_fetch_exposed_s +=
      (rep.grad_spill_bytes + whole) / s.cluster.offload.write_bw + back / s.cluster.offload.read_bw;
}

}  // namespace loom::sim
