#include "loom/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loom/core/error.h"
#include "loom/model/layout.h"
#include "loom/parallel/schedule.h"
#include "loom/parallel/stage_part.h"
#include "loom/rank/duties.h"
#include "loom/sim/replay.h"
#include "loom/sim/unit_cost.h"
#include "loom/sim/zero_cost.h"

namespace loom::sim {

// Note [Simulated step]
// One pipeline (dp rank 0, tp rank 0, cp rank 0) stands for all: dp, tp and cp replicas
// run the same steps at the same times. The simulator builds the engine's schedule with
// parallel::make_schedule and replays it with blocking semantics: a forward of virtual
// stage v starts when its rank is free and stage v-1's forward of that micro-batch has
// finished plus the point-to-point transfer; a backward waits for stage v+1's backward.
// Each step costs its chunk's layers (Note [Cost model]): kernels plus the tp / cp
// collectives, which run on the critical path as in Megatron; recompute adds the
// recomputed forward to the backward; ZeRO-2/3's per-micro-batch reduce-scatter and
// ZeRO-3's parameter gathers overlap the layer's compute and only their excess is charged.
// After its last backward each rank reduces its gradients over dp (x cp): with overlap
// the reduction runs under the last micro-batch's backward and only the tail past it is
// exposed (at least the last bucket); then GPT's tied embedding is summed between the
// first and last stage, the optimizer updates the local shard (memory-bound), and
// ZeRO-1/2 all-gather the updated parameters. Step time is the slowest rank's end.
// Activation memory is tracked along the replay: a forward adds its chunk's stored bytes,
// a backward adds the recompute transient, then frees the chunk's bytes. Zero-bubble
// schedules (Note [B/W split] in model/model.h) replay B as the backward less the blocks' weight-gradient GEMMs and W as those GEMMs, after its own B; the chunk's bytes stay until
// W, and B adds the W slot's kept upstream gradients, which W frees.

namespace {

// Note [Recompute] (model/model.cc): loom's full recompute, and PyTorch's non-reentrant one from torch
// 2.1 on, stop before the MLP's output projection.
bool stops_early(const SimPlan& p) { return p.framework == Framework::kLoom || p.recompute_early_stop; }

Setup make_setup(const SimPlan& plan, const ClusterSpec& cluster) {
  const Config& cfg = plan.cfg;
  const ParallelConfig& par = cfg.parallel;
  // The byte widths, p2p costs and chunks are set below.
  Setup s{plan, cluster, par.tp, par.pp, par.dp, plan.cp, par.vpp, par.pp * par.vpp, cfg.train.grad_accum,
          cfg.seq_len(), {}, {}, {}, 4, 4, 4, 0, 0, {}, false};
  s.rk = par.recompute_layers(cfg.model.layers);
  s.split = splits_backward(par.schedule) && s.pp > 1;
  LOOM_CONFIG_CHECK(s.cp >= 1, "--cp ", s.cp, ": expected >= 1");
  LOOM_CHECK(cfg.parallel.cp == 1, "the simulator takes context parallelism as SimPlan::cp (", plan.cp,
             "), not parallel.cp (", cfg.parallel.cp, ")");
  LOOM_CONFIG_CHECK(plan.gpus() == cluster.devices(), "layout dp x tp x pp x cp = ", s.dp, " x ", s.tp, " x ", s.pp, " x ",
             s.cp, par.ps_servers > 0 ? " + " + std::to_string(par.servers()) + " parameter servers" : std::string(),
             " = ", plan.gpus(), " ranks but cluster ", cluster.name, " has ", cluster.devices(), " devices (",
             cluster.nodes, " nodes x ", cluster.devices_per_node, "); set --gpus ", plan.gpus(),
             " or change the layout");
  LOOM_CONFIG_CHECK(s.seq % s.cp == 0, "sequence ", s.seq, " is not divisible by --cp ", s.cp);
  check_framework_runs(plan);
  check_activation_offload(plan, cluster);
  LOOM_CONFIG_CHECK(cfg.offload.params != loom::OffloadTier::kDisk || plan.framework == Framework::kLoom,
                    "offload.params = disk is loom's chunk manager (Note [Chunk manager]): simulate it with "
                    "--framework loom, or drop offload.params");
  LOOM_CONFIG_CHECK(cfg.offload.grads != loom::OffloadTier::kDisk || plan.cp == 1, "offload.grads = disk runs in one process; --cp ",
                    plan.cp, " needs cp = 1");
  LOOM_CONFIG_CHECK(cfg.offload.optimizer != loom::OffloadTier::kDisk || cluster.offload.read_bw > 0, "offload.optimizer = disk: cluster ",
                    cluster.name, " has no offload tier; give it one (--set cluster.offload.read_gbps=R --set "
                    "cluster.offload.write_gbps=W --set cluster.offload.capacity_gib=C) or drop the offload");
  s.pl.tp = place_group(cluster, s.tp, 1);
  s.pl.cp = place_group(cluster, s.cp, s.tp);
  s.pl.dp = place_group(cluster, s.dp * s.cp, s.tp);  // gradients are reduced over dp x cp
  const int64_t rank_stride = s.tp * s.cp * s.dp;
  s.pl.p2p = place_group(cluster, s.pp > 1 ? 2 : 1, rank_stride);
  s.pl.tied = place_group(cluster, s.pp > 1 ? 2 : 1, rank_stride * (s.pp - 1));
  s.x = LayerShape::of(cfg.model, cfg.micro_batch(), s.seq, s.tp, s.cp, par.sp, cluster.device.dtype_bytes);
  s.x.cp_regather = plan.framework == Framework::kLoom;  // Note [Context-parallel pricing]
  s.x.cp_ulysses = cfg.parallel.cp_mode == CpMode::kUlysses;
  s.x.cp_ring = cfg.parallel.cp_mode == CpMode::kRing && plan.framework == Framework::kLoom;
  if (plan.framework == Framework::kLoom) s.x.dropout = false, s.x.fused_attention = true, s.x.fused_residual_grad = true;
  if (plan.framework != Framework::kLoom) s.x.attention = plan.attention;
  if (plan.gemm_format != GemmFormat::kBf16) {  // Note [fp8 GEMMs]
    LOOM_CONFIG_CHECK(plan.framework != Framework::kLoom, "--precision (or train.gemm_format) ",
                      name_of(plan.gemm_format),
                      ": fp8 is priced for Megatron-core and FSDP stacks on GPUs (--framework megatron or fsdp); "
                      "loom's engine runs fp8 GEMMs on one GPU only (train.gemm_format = fp8, a Llama, "
                      "train.device = cuda), which the simulator does not price yet");
    LOOM_CONFIG_CHECK(cluster.device.fp8_peak_flops > 0, "--precision ", name_of(plan.gemm_format),
                      ": device ", cluster.device.name, " of cluster ", cluster.name,
                      " has no fp8 tensor cores (cluster.device.fp8_peak_tflops is 0); H100 and Blackwell do");
    LOOM_CONFIG_CHECK(plan.gemm_format != GemmFormat::kNvfp4 || cluster.device.fp4_peak_flops > 0,
                      "--precision nvfp4: device ", cluster.device.name, " of cluster ", cluster.name,
                      " has no fp4 tensor cores (cluster.device.fp4_peak_tflops is 0); Blackwell does (dgx-b200, "
                      "gb200-nvl72, gb300-nvl72); use fp8 or mxfp8 here");
    s.x.gemm_format = plan.gemm_format;
  }
  s.x.vocab_split = par.vocab_parallel && s.tp > 1;
  s.wbytes = cluster.device.mixed_precision ? double(cluster.device.dtype_bytes) : 4.0;
  // Note [bf16 parameter gathers]: bf16, or qwZ's int8 with an fp32 scale per block
  s.gather_bytes = cfg.comm.param_dtype == FloatFormat::kBf16 ? 2.0
                   : cfg.parallel.zeropp_qwz      ? 1.0 + 4.0 / 256  // comm::kQuantBlock
                                                  : s.wbytes;
  // Note [qgZ]: an all-to-all of int8 blocks sends as many bytes as a reduce-scatter of them, as the ring
  // codecs do (Note [Ring codecs]); whole buckets (Note [Compressed ZeRO-2/3]) leave no reduce-scatter.
  if (plan.fp8_param_gather) {  // Note [fp8 weights under ZeRO-3]
    LOOM_CONFIG_CHECK(plan.gemm_format != GemmFormat::kBf16 && par.zero >= 3 && plan.framework != Framework::kLoom &&
                          plan.framework != Framework::kDeepSpeed2021,
                      "--fp8-param-gather gathers ZeRO-3's weights in fp8: it needs --precision fp8 (or mxfp8, nvfp4), "
                      "ZeRO-3 and --framework fsdp (Megatron-FSDP, FSDP2); have precision ",
                      name_of(plan.gemm_format), ", zero ", par.zero, ", framework ", framework_name(plan.framework));
    s.gather_bytes = operand_bytes(plan.gemm_format, s.wbytes);
  }
  s.scatter_bytes = par.reduces_whole_buckets() ? 0.0
                    : par.zeropp_qgz || par.compress == CompressKind::kInt8 ? 1.0 + 4.0 / 256
                    : cfg.comm.grad_dtype == FloatFormat::kBf16 || par.compress == CompressKind::kBf16
                        ? std::min(2.0, s.wbytes)
                        : s.wbytes;
  const double wire = cfg.comm.p2p_dtype == FloatFormat::kBf16 ? 2.0 : s.x.dtype_bytes;  // Note [bf16 pipeline transfers]
  s.p2p_bytes = s.x.tokens() * s.x.h * wire / double(s.tp);  // Megatron's scatter-gather
  s.p2p_s = s.pp > 1 ? collective_time_s(cluster, OpKind::kSend, s.p2p_bytes, s.pl.p2p) : 0;
  return s;
}

// Per virtual stage: its layers' block costs plus the embedding (first) and head (last).
// Note [fp8 weights under ZeRO-3]: each pass casts the unit it gathered (or, gathering fp8
// values, the forward nothing and the backward their transpose).
void price_gathered_fp8(const Setup& s, ChunkCost& ch) {
  const double cast = memory_time_s(s.cluster.device, fp8_cast_bytes(s.x.gemm_format, ch.fp8_weights));
  const double transpose = memory_time_s(s.cluster.device, 2 * operand_bytes(s.x.gemm_format, 2) * ch.fp8_weights);
  ch.fwd.compute += s.plan.fp8_param_gather ? 0.0 : cast;
  ch.bwd.compute += s.plan.fp8_param_gather ? transpose : cast;
}

void build_chunks(Setup& s) {
  const ModelConfig& model = s.plan.cfg.model;
  const ParallelConfig& par = s.plan.cfg.parallel;
  // One block cost per recompute policy; each layer adds the one its policy selects.
  std::vector<UnitCost> block;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    block.push_back(unit_cost(s.cluster, s.pl, block_forward_ops(s.x), r, s.plan.tp_overlap, true, stops_early(s.plan)));
    block.back().act_bytes = layer_activation_bytes(s.x, r);
    block.back().transient_bytes = layer_recompute_transient_bytes(s.x, r);
  }
  UnitCost embed = unit_cost(s.cluster, s.pl, embedding_forward_ops(s.x), Recompute::kNone, s.plan.tp_overlap);
  embed.act_bytes = embedding_activation_bytes(s.x);
  UnitCost head = unit_cost(s.cluster, s.pl, head_forward_ops(s.x), Recompute::kNone, s.plan.tp_overlap);
  head.act_bytes = head_activation_bytes(s.x);
  if (s.plan.framework == Framework::kLoom) fuse_backward_into_forward(head);  // Note [Fused loss backward]
  const ParamCount bp = block_params(model, s.tp);
  double& fp8_block = s.fp8_block;  // Note [fp8 GEMMs]: a block's fp8 weights, FLOPs / (2 n) of each fp8 GEMM
  for (const Op& o : block_forward_ops(s.x))
    if (o.fp8) fp8_block += o.flops / (2 * s.x.tokens());
  s.fp8_per_gather = fp8_block > 0 && par.zero >= 3 && s.dp * s.cp > 1;  // Note [fp8 weights under ZeRO-3]
  const std::vector<bool> keep = par.zero_keep_layers(model.layers);
  // ZeRO-2/3 per layer and micro-batch, by recompute policy and kept or not: priced once, as
  // the framework runs them (Note [Sharding implementations]).
  ZeroLayerCost zero[3][2];
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 2; ++k) zero[r][k] = zero_layer_cost(s, block[size_t(r)], Recompute(r), k == 1);
  const std::vector<int> layers = parallel::stage_layers(int(model.layers), int(s.V), par.layer_split(model.layers));
  // Note [Resident memory]: loom's engine hands the gradient pages of the ZeRO-2/3 pieces it
  // does not own back to the OS after each reduction, and the next backward's `dW +=`
  // faults them in again (its gradients are fp32 in every precision): seconds per
  // parameter, every micro-batch without a pipeline
  // (each reduces), once per step with one (the reduction waits for the last micro-batch).
  // (ZeRO-3's parameter pages fault in the gathers, on the comm path; not modelled.)
  const double G = double(s.dp * s.cp), fault_bw = s.cluster.device.page_fault_bw;
  const double refault = s.plan.framework == Framework::kLoom && par.zero >= 2 && G > 1 && fault_bw > 0
                             ? (1 - 1 / G) * 4.0 / fault_bw / (s.pp > 1 ? double(s.m) : 1.0)
                             : 0.0;
  if (par.pp_vocab) price_vocab_passes(s);
  s.chunks.assign(static_cast<size_t>(s.V), ChunkCost{});
  int64_t first = 0;
  for (int64_t v = 0; v < s.V; ++v) {
    ChunkCost& ch = s.chunks[size_t(v)];
    const int64_t n = layers[size_t(v)];
    for (int64_t l = first; l < first + n; ++l) {
      const UnitCost& b = block[size_t(s.rk[size_t(l)])];
      add_unit(ch, b, 1);
      // ZeRO-2/3 per micro-batch: the gradients' reduce-scatter in backward; ZeRO-3 also
      // gathers the layer's parameters in forward and backward, or (parallel.zero_keep)
      // once per step, spread here over the step's micro-batches.
      const ZeroLayerCost& z = zero[int(s.rk[size_t(l)])][keep[size_t(l)] ? 1 : 0];
      ch.fwd.zero += z.fwd;
      ch.bwd.zero += z.bwd;
      if (l - first < s.plan.activation_offload_layers) offload_layer(s, ch, b);  // Note [Activation offload]
    }
    // A block's dY per linear (model.h Note [B/W split]): 2 C + F2 + Q values per token row.
    const double hd = s.x.h / s.x.a, f2 = (model.arch == Arch::kGpt ? 1 : 2) * s.x.f / s.x.t;
    ch.w_bytes = double(n) * s.x.tokens() * (2 * s.x.h + f2 + (s.x.a + 2 * s.x.g) * hd / s.x.t) * s.x.dtype_bytes;
    first += n;
    ch.params = double(n) * bp.per_tp_rank;
    ch.fp8_weights = double(n) * fp8_block;
    if (s.fp8_per_gather) price_gathered_fp8(s, ch);
    if (par.pp_vocab) {  // Note [Vocabulary passes]: every rank's first chunk holds a slice
      if (v < s.pp) ch.params += s.vocab_params;
    } else {
      if (v == 0) {
        add_unit(ch, embed, 1);
        ch.params += embedding_params(model, int64_t(s.x.vocab_t())).per_tp_rank;
      }
      if (v == s.V - 1) {
        add_unit(ch, head, 1);
        ch.params += head_params(model, int64_t(s.x.vocab_t())).per_tp_rank;
      }
    }
    ch.bwd.compute += refault * ch.params;
  }
}

// Per chunk of pipeline rank r: the micro-batches it held at once in the replay (one per
// chunk without a pipeline: the engine then runs micro-batches one after another).
std::vector<int> chunk_peaks(const Setup& s, const RankState& st) {
  return s.pp == 1 ? std::vector<int>(size_t(s.vpp), 1) : st.chunk_peak;
}

// loom's engine: the model's own activation carve (model/layout.h) for this rank's part
// (parallel::rank_part, as plan_rank gives it). The engine allocates the schedule's peak in
// flight as slots per chunk but takes the lowest free slot, so only the pages of each
// chunk's own peak are ever resident.
// wpeak: per chunk, the W slots of a split backward.
double loom_activation_bytes(const Setup& s, int64_t r, const std::vector<int>& peak, const std::vector<int>& wpeak) {
  const Config& cfg = s.plan.cfg;
  const std::vector<Recompute>& rk = s.rk;
  auto floats = [&](const ModelPart& part, int slots, int w_slots = 0) {
    return double(activation_floats(cfg.model, part, cfg.micro_batch(), s.seq / s.cp, slots, rk, cfg.parallel.sp,
                                    cfg.train.precision == Precision::kBf16, w_slots, key_seq_of(s.cp, cfg.parallel.cp_mode, s.seq)));
  };
  ModelPart all = parallel::rank_part(cfg, int(r), 0);
  all.chunks = all.resolved_chunks(cfg.model);
  double total = 0;
  for (size_t c = 0; c < all.chunks.size(); ++c) {
    ModelPart one = all;  // this chunk alone: its slot bytes are floats(1) - floats(0)
    one.chunks = {all.chunks[c]};
    one.embed = all.embed && c == 0;
    one.head = all.head && c + 1 == all.chunks.size();
    total += double(peak[c]) * (floats(one, 1) - floats(one, 0)) + double(wpeak[c]) * (floats(one, 0, 1) - floats(one, 0));
  }
  return (total + floats(all, 0)) * s.x.dtype_bytes;  // + what every layout carves once
}

// Layers of pipeline rank r whose ZeRO-3 parameters stay gathered (parallel.zero_keep).
double kept_layers(const Setup& s, int64_t r) {
  const ParallelConfig& par = s.plan.cfg.parallel;
  if (par.zero < 3 || par.zero_keep.empty()) return 0;
  const std::vector<bool> keep = par.zero_keep_layers(s.plan.cfg.model.layers);
  const ModelPart part = parallel::rank_part(s.plan.cfg, int(r), 0);
  double n = 0;
  for (const auto& [first, end] : part.resolved_chunks(s.plan.cfg.model))
    for (int l = first; l < end; ++l) n += keep[size_t(l)] ? 1 : 0;
  return n;
}

// The dp buckets of `params` parameters (parallel.bucket_mb each, at least one).
double dp_buckets(const Setup& s, double params) {
  return std::max(1.0, std::ceil(params * s.wbytes / (s.plan.cfg.parallel.bucket_mb * double(1 << 20))));
}

// A bucketed collective of t seconds whose one bucket runs alone (the last reduced after
// backward, the first gathered before forward) and the rest beside `window` of compute
// (Note [Overlap contention]).
double bucketed_overlap_s(const Setup& s, double t, double params, double window) {
  const double alone = t / dp_buckets(s, params);
  return alone + overlapped_s(s.cluster.device, t - alone, window);
}

// The gradient sync (ZeRO 0's all-reduce, ZeRO-1's reduce-scatter) left after pipeline rank r's last backward
// window: the exact ring overlapped with backward but for its last bucket (the overlapped part
// priced by Note [Overlap contention]), a ring codec likewise, or a stateful compressor or Adasum after backward (compressed_sync).
double dp_exposed_s(const Setup& s, int64_t r, double params, double last_bwd_window) {
  const ParallelConfig& par = s.plan.cfg.parallel;
  const CompressKind compress = par.compress;
  if (par.reduces_whole_buckets()) {
    const CompressedSync c = compressed_sync(s.cluster, s.plan.cfg, r, s.pl.dp);
    return c.comm_s + c.compute_s;
  }
  const OpKind op = par.zero == 1 ? OpKind::kReduceScatter : OpKind::kAllReduce;
  // comm.grad_dtype = bf16 or a ring codec (Note [Compressed all-reduce]): the ring carries
  // 2-byte values (bf16) or 1 byte and a scale per 256 (int8); the rounding passes are not
  // priced.
  const bool bf16 = s.plan.cfg.comm.grad_dtype == FloatFormat::kBf16 || compress == CompressKind::kBf16;
  const double wire = bf16 ? std::min(2.0, s.wbytes) : compress == CompressKind::kInt8 ? 1.0 + 4.0 / 256 : s.wbytes;
  const double t = collective_time_s(s.cluster, op, params * wire, s.pl.dp);
  // Note [Streams with data parallelism]: a stream's stage reduces each update's gradient whole, exposed.
  return s.plan.dp_overlap && !rank::in_stream(rank::update_rule(s.plan.cfg)) ? bucketed_overlap_s(s, t, params, last_bwd_window) : t;
}

// Note [Parameter-gather overlap]
// ZeRO-1/2 (Megatron's distributed optimizer) all-gather the updated parameters after the
// optimizer. With Megatron-core's --overlap-param-gather the gather of each bucket is issued
// then and waited for only by the next step's forward of that bucket's layers: the forward
// starts once the first bucket is in, and the rest gathers under micro-batch 0's forward, as
// the gradient reduction hides under the last backward (dp_exposed_s). Exposed:
// t / buckets + overlapped(t - t / buckets, window) (Note [Overlap contention]; with
// overlap_cost 0, max(t / buckets, t - window)), window = this pipeline rank's forward passes of micro-batch 0
// (the next step's, the same in the steady state). Without the flag the gather is exposed whole.
double param_gather_s(const Setup& s, double params, double first_fwd_window) {
  const double t = collective_time_s(s.cluster, OpKind::kAllGather, params * s.wbytes, s.pl.dp);
  return s.plan.param_gather_overlap ? bucketed_overlap_s(s, t, params, first_fwd_window) : t;
}

// Note [Simulated parameter server]
// parallel.ps_servers = S (Note [Parameter server] in modes/ps/ps.h): each of the W workers
// of a model shard (its tp x pp coordinate: Note [Parameter server with model parallelism])
// pushes its fp32 gradient (the rank's P floats) and pulls the updated weights; each of the
// shard's S servers takes W P / S floats in and sends as many out. A direction costs the slower of a worker's link (P) and a
// server's (W P / S) at the link's bandwidth - the intra-node tier when every rank fits one
// node, else the inter-node one - plus its latency; between them the servers run AdamW on
// P / S parameters (32 bytes each: read w, g, m, v, write w, m, v; SGD 20). Nothing overlaps:
// a sync round starts after backward and the next step waits for the pull.
// Under ps.sparse_embedding (Note [Sparse embeddings]) the table's V d floats move as the U
// rows a worker's step reads, U = V (1 - (1 - 1/V)^n) for its n tokens per step (uniform
// draws: an upper bound for text, whose Zipf tail repeats tokens), d + 1 floats each (the
// id), each way; the servers' lazy AdamW updates the union of the W workers' rows, at most
// min(V, W U) of them.
double ps_round_s(const Setup& s, double params) {
  const Config& cfg = s.plan.cfg;
  const ParallelConfig& par = cfg.parallel;
  const double W = double(s.dp), S = double(par.ps_servers);
  double moved = params, updated = params;  // floats each way per worker; floats the servers update
  if (cfg.ps.sparse_embedding) {
    const double V = double(cfg.model.vocab), d = double(cfg.model.d_model);
    const double n = double(cfg.micro_batch() * cfg.train.grad_accum * s.seq);
    const double U = V * (1.0 - std::pow(1.0 - 1.0 / V, n));
    moved = params - V * d + U * (d + 1), updated = params - V * d + std::min(V, W * U) * d;
  }
  const LinkTier& link = par.ranks() <= s.cluster.devices_per_node ? s.cluster.intra : s.cluster.inter;
  const double bytes = moved * 4;
  const double one_way = std::max(bytes, W * bytes / S) / (link.bw * link.efficiency) + link.latency_s;
  return 2 * one_way + memory_time_s(s.cluster.device, updated / S * cfg.optim.update_bytes());
}

// Pipeline rank r's memory at its peak (rep: its params so far).
MemoryBreakdown rank_memory(const Setup& s, int64_t r, const RankState& st, const RankReport& rep) {
  const ParallelConfig& par = s.plan.cfg.parallel;
  const ModelConfig& model = s.plan.cfg.model;
  const double G = double(s.dp * s.cp);
  const bool offload = s.plan.cfg.offload.optimizer == loom::OffloadTier::kDisk;
  const double moment_floats = 2 * rep.params / (par.zero >= 1 ? G : 1.0);
  MemoryBreakdown mem = model_state_bytes(rep.params, s.dp * s.cp, par.zero, s.cluster.device, s.plan.cfg.optim.moment_bytes());
  if (par.zero >= 2 && par.reduces_whole_buckets()) mem.grads *= G;  // Note [Compressed ZeRO-2/3]
  if (par.zero >= 1 && G > 1 && compress_in_optimizer(par.compress)) mem.optimizer += 4 * rep.params;  // D whole (Note [Compressed Adam with ZeRO])
  // Note [Pipeline streams]: 2bw's second version and pending gradient, pipedream's stashes,
  // pipemare's velocity and corrected weights.
  mem.params *= stream_param_copies(par.schedule, int(s.pp), int(r));
  // Note [The next step's first forwards ahead]: the copy, where no stash holds W(t)'s rows.
  if (st.vocab_aside && stream_param_copies(par.schedule, int(s.pp), int(r)) < 2) mem.params += s.wbytes * s.vocab_params;
  mem.grads *= stream_grad_copies(par.schedule, int(s.pp));
  if (offload)  // the moments leave; their sub-group buffers stay (fp32 masters too, in mixed precision)
    mem.optimizer += double(s.plan.cfg.offload.buffer_bytes(int64_t(moment_floats / 2))) - 4 * moment_floats;
  if (s.plan.cfg.offload.params == loom::OffloadTier::kDisk && s.cluster.device.mixed_precision)  // the masters are the file's p
    mem.optimizer -= 4 * moment_floats / 2;
  mem.activations = st.peak_live;
  for (int64_t c = 0; c < s.vpp; ++c)  // Note [Activation offload]: a layer's activations in transit
    mem.activations += s.chunks[size_t(parallel::virtual_stage(par.schedule, int(s.pp), int(r), int(c)))].offload_buffer;
  mem.params += kept_layers(s, r) * block_params(model, s.tp).per_tp_rank * s.wbytes;  // whole gathered copies
  if (s.plan.framework == Framework::kLoom) {
    mem.activations = loom_activation_bytes(s, r, chunk_peaks(s, st), st.pending_peak);
    // ZeRO-3: the gather pool (current + prefetched unit), and one unit's gradients before
    // its reduce-scatter; ZeRO-2: the largest bucket's gradients before theirs.
    const double unit = block_params(model, s.tp).per_tp_rank * s.wbytes, keep = 1.0 - 1.0 / G;
    if (par.zero >= 3) mem.params += 2 * unit, mem.grads += unit * keep;
    if (par.zero >= 3 && par.zeropp_hpz)  // Note [hpZ]: the secondary pieces of the units not kept
      mem.params += (rep.params - kept_layers(s, r) * block_params(model, s.tp).per_tp_rank) * s.wbytes /
                    double(std::max<int64_t>(1, s.pl.dp.per_node));
    if (par.zero == 2) mem.grads += std::min(rep.params * s.wbytes, par.bucket_mb * double(1 << 20)) * keep;
    const double boundary = s.x.tokens() / (s.x.sp ? s.x.t : 1) * s.x.h;  // values per stage transfer
    if (s.pp > 1) mem.buffers = boundary * s.x.dtype_bytes;  // receive buffer
    if (s.pp > 1 && s.plan.cfg.comm.p2p_dtype == FloatFormat::kBf16) {  // bf16 receive + one send buffer per slot in use
      const std::vector<int> peak = chunk_peaks(s, st);
      mem.buffers += 2 * boundary * (1 + std::accumulate(peak.begin(), peak.end(), 0));
    }
    if (par.zero >= 3 && s.gather_bytes < s.wbytes)  // bf16 gather buffers beside the pool: unit + own piece, twice
      mem.buffers += 2 * block_params(model, s.tp).per_tp_rank * s.gather_bytes * (1.0 + 1.0 / G);
    if (par.pp_vocab && s.pp > 1)  // Note [Vocabulary passes]: the head's input and gradient, the lookups (floats)
      mem.buffers += 4 * (2 * s.x.tokens() * s.x.h + st.vocab_buffers * boundary);
    const double wire = s.plan.cfg.comm.p2p_dtype == FloatFormat::kBf16 ? 2 : 4;  // Note [Stream gradient sends]
    mem.buffers += st.send_copies * boundary * wire;
    return mem;
  }
  if (s.pp > 1) mem.buffers += 2 * s.p2p_bytes;                              // send + receive
  if (s.x.sp) mem.buffers += s.x.tokens() * s.x.h * s.x.dtype_bytes;         // sp all-gather output
  if (par.zero >= 3) mem.buffers += 2 * block_params(model, s.tp).per_tp_rank * s.wbytes;  // unit + prefetch
  return mem;
}

// After the pipeline: gradient reduction, tied embedding, optimizer, parameter gather.
// Note [fp8 GEMMs]: the weights of pipeline rank r's fp8 linear layers.
double fp8_weights_of(const Setup& s, int64_t r, ScheduleKind kind) {
  double w = 0;
  for (int64_t c = 0; c < s.vpp; ++c) w += s.chunks[size_t(parallel::virtual_stage(kind, int(s.pp), int(r), int(c)))].fp8_weights;
  return w;
}

RankReport finish_rank(const Setup& s, int64_t r, const RankState& st, std::vector<SimEvent>* events) {
  const ParallelConfig& par = s.plan.cfg.parallel;
  const ModelConfig& model = s.plan.cfg.model;
  const DeviceSpec& dev = s.cluster.device;
  const ScheduleKind kind = par.schedule;
  // GPT's tied wte: copied on the ends, unless one rank holds both (ZB-V) or each its slice (pp_vocab).
  const bool tied = model.arch == Arch::kGpt && s.pp > 1 && kind != ScheduleKind::kZbV && !par.pp_vocab;
  const double G = double(s.dp * s.cp);
  RankReport rep;
  rep.pp_rank = r;
  rep.global_rank = r * s.tp * s.cp * s.dp;
  rep.chunk_in_flight = chunk_peaks(s, st);
  for (int64_t c = 0; c < s.vpp; ++c) rep.params += s.chunks[size_t(parallel::virtual_stage(kind, int(s.pp), int(r), int(c)))].params;
  const double wte = double(model.vocab * model.d_model) / s.x.vocab_t();
  if (tied && r == s.pp - 1) rep.params += wte;  // the last stage's copy of the tied embedding
  rep.pipeline_end_s = st.free_at;
  rep.busy_s = st.spent.total();
  if (G > 1 && (par.zero <= 1 || par.reduces_whole_buckets()) && par.ps_servers == 0)  // Note [Compressed ZeRO-2/3]
    rep.dp_exposed_s = dp_exposed_s(s, r, rep.params, st.last_bwd_window);
  if (tied && (r == 0 || r == s.pp - 1))
    rep.tied_s = collective_time_s(s.cluster, OpKind::kAllReduce, wte * s.wbytes, s.pl.tied);
  // Note [Vocabulary passes across a step's end]: a stream's vocabulary slices update in a pass.
  rep.optimizer_s = update_s(s, rep.params - (st.vocab_updated ? s.vocab_params : 0));
  rep.optimizer_s += memory_time_s(dev, stream_copies(s, r) * rep.params * s.wbytes);
  // Note [fp8 GEMMs]: their cast, once a step, and their copy and transpose held through it;
  // under ZeRO-3 (Note [fp8 weights under ZeRO-3]) those of the two units gathered at once.
  const double fp8_weights = s.fp8_per_gather ? 2 * s.fp8_block : fp8_weights_of(s, r, kind);
  if (!s.fp8_per_gather) rep.optimizer_s += memory_time_s(dev, fp8_cast_bytes(s.x.gemm_format, fp8_weights));
  // Note [Optimizer offload]: the moments stream through the offload tier while the update
  // runs, so the slower of the two bounds the phase; one I/O thread reads and writes in turn.
  const bool offload = s.plan.cfg.offload.optimizer == loom::OffloadTier::kDisk;
  const double moment_floats = 2 * rep.params / (par.zero >= 1 ? G : 1.0);
  if (par.ps_servers > 0) {  // Note [Simulated parameter server]: the servers hold the optimizer
    rep.ps_s = ps_round_s(s, rep.params);
    rep.optimizer_s = 0;
  }
  rep.memory = rank_memory(s, r, st, rep);
  rep.memory.params += weight_copy_bytes(s.x.gemm_format) * fp8_weights;
  if (par.ps_servers > 0) rep.memory.optimizer = 0;
  // Note [PipeDream weight stashing]: the tied wte's gradients in flight between the ends.
  if (updates_per_batch(kind) && tied && (r == 0 || r == s.pp - 1)) rep.memory.buffers += double(s.pp) * wte * 4;
  if (offload) {  // with parameter offload p streams with m and v: three arrays, not two
    const double bytes = 4 * moment_floats * (s.plan.cfg.offload.params == loom::OffloadTier::kDisk ? 1.5 : 1.0);
    if (page_cached(s, rep)) {  // Note [Page-cached offload]: copies on the update's cores
      rep.offload_io_s = cached_copy_s(s, bytes, bytes);
      rep.optimizer_s += rep.offload_io_s;
    } else {
      rep.offload_io_s = bytes * (1 / s.cluster.offload.read_bw + 1 / s.cluster.offload.write_bw);
      rep.optimizer_s = std::max(rep.optimizer_s, rep.offload_io_s);
    }
  }
  if (G > 1 && (par.zero == 1 || par.zero == 2)) rep.param_gather_s = param_gather_s(s, rep.params, st.first_fwd_window);
  if (s.plan.cfg.offload.params == loom::OffloadTier::kDisk) price_param_offload(s, rep);
  double t = rep.pipeline_end_s;
  auto phase = [&](const char* name, const char* cat, int tid, double dur) {
    if (dur <= 0) return;
    if (events) events->push_back({rep.global_rank, tid, name, cat, t, t + dur});
    t += dur;
  };
  phase("param_fetch (exposed)", "io", 0, rep.param_fetch_exposed_s);
  phase("grad_sync (exposed)", "collective", 1, rep.dp_exposed_s);
  phase("tied_embedding_sync", "collective", 1, rep.tied_s);
  const bool in_stream = kind == ScheduleKind::k2BW && s.pp > 1;  // Note [Measured bubble]
  // Note [2BW's update in the waits]: a stage with a stash writes its update while it waits.
  const double waited = in_stream && stream_param_copies(kind, int(s.pp), int(r)) > 1
                            ? update_in_waits(st, rep.optimizer_s, events, rep.global_rank)
                            : 0;
  phase(in_stream ? "U" : "optimizer", in_stream ? "update" : "compute", 0, rep.optimizer_s - waited);
  rep.update_end_s = in_stream ? t : 0;
  phase("ps_push_update_pull", "collective", 1, rep.ps_s);
  phase("param_gather", "collective", 1, rep.param_gather_s);
  rep.step_end_s = t;
  return rep;
}

void summarize(const Setup& s, const std::vector<RankState>& states, SimResult& res) {
  const Config& cfg = s.plan.cfg;
  const DeviceSpec& dev = s.cluster.device;
  size_t worst = 0, heaviest = 0;
  double busy = 0, pipe_end = 0, most = 0;
  for (size_t r = 0; r < res.ranks.size(); ++r) {
    if (res.ranks[r].step_end_s > res.ranks[worst].step_end_s) worst = r;
    if (res.ranks[r].memory.total() > res.ranks[heaviest].memory.total()) heaviest = r;
    busy += res.ranks[r].bubble_busy_s(), most = std::max(most, res.ranks[r].bubble_busy_s());
    pipe_end = std::max(pipe_end, res.ranks[r].bubble_end_s());
  }
  const RankReport& w = res.ranks[worst];
  res.step_time_s = w.step_end_s;
  res.bubble_fraction = pipe_end > 0 ? 1.0 - busy / (double(s.pp) * pipe_end) : 0;
  res.bubble_floor = pipe_end > 0 ? bubble_floor(busy, most, double(s.pp)) : 0;
  const double batch = double(cfg.train.batch);
  res.tokens_per_s = batch * double(s.seq) / res.step_time_s;
  res.model_flops = model_flops_per_sequence(cfg.model, s.seq, s.x.flash()) * batch;
  LayerShape one = LayerShape::of(cfg.model, 1, s.seq, 1, 1, false, dev.dtype_bytes);
  one.attention = s.x.attention;
  double extra = 0;  // recomputed forward FLOPs per sequence
  for (Recompute r : s.rk) {
    if (r == Recompute::kFull) extra += flops_of(full_recompute_ops(block_forward_ops(one), stops_early(s.plan)), false);
    if (r == Recompute::kSelective) extra += flops_of(block_forward_ops(one), true);
  }
  res.hardware_flops = res.model_flops + extra * batch;
  const double denom = res.step_time_s * double(res.gpus);
  res.tflops_per_gpu = res.model_flops / denom / 1e12;
  res.mfu = res.model_flops / (denom * dev.peak_flops);
  res.hfu = res.hardware_flops / (denom * dev.peak_flops);
  res.peak_rank = res.ranks[heaviest].global_rank;
  res.peak_memory_bytes = res.ranks[heaviest].memory.total();
  const Pass& sp = states[worst].spent;
  Breakdown& b = res.breakdown;
  b.recompute = states[worst].recomputed;
  b.compute = sp.compute;
  b.tp_comm = sp.tp;
  b.cp_comm = sp.cp;
  b.vocab_comm = sp.vocab;
  b.zero_comm = sp.zero + w.param_gather_s;
  b.pp_idle = w.pipeline_end_s - w.busy_s;
  b.dp_exposed = w.dp_exposed_s + w.tied_s + w.ps_s;
  b.optimizer = w.optimizer_s;
  b.param_fetch = w.param_fetch_exposed_s;
  for (const RankReport& r : res.ranks)
    if (r.memory.total() > dev.memory_bytes)
      res.warnings.push_back(detail::cat("pipeline rank ", r.pp_rank, " needs ", r.memory.total() / double(1 << 30),
                                         " GiB but a ", dev.name, " has ", dev.memory_bytes / double(1 << 30), " GiB"));
}

}  // namespace

BlockCosts block_costs(const SimPlan& plan, const ClusterSpec& cluster) {
  const Setup s = make_setup(plan, cluster);
  BlockCosts out;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    const UnitCost u = unit_cost(cluster, s.pl, block_forward_ops(s.x), r, plan.tp_overlap, false, stops_early(plan));
    out.time_s[int(r)] = u.fwd.total() + u.bwd.total() + u.recompute.total();
    out.act_bytes[int(r)] = layer_activation_bytes(s.x, r);
    const ParallelConfig& par = plan.cfg.parallel;
    if (par.zero >= 2 && s.dp * s.cp > 1) {
      const ZeroLayerCost shard = zero_layer_cost(s, u, r, false);
      out.zero_shard_s[int(r)] = shard.fwd + shard.bwd;
      if (par.zero >= 3 && plan.framework != Framework::kDeepSpeed2021) {
        const ZeroLayerCost keep = zero_layer_cost(s, u, r, true);
        out.zero_keep_s[int(r)] = keep.fwd + keep.bwd;
      } else {
        out.zero_keep_s[int(r)] = out.zero_shard_s[int(r)];  // nothing to keep (ZeRO-2, or not offered)
      }
      out.unit_bytes = block_params(plan.cfg.model, s.tp).per_tp_rank;
    }
  }
  const UnitCost e = unit_cost(cluster, s.pl, embedding_forward_ops(s.x), Recompute::kNone, plan.tp_overlap);
  const UnitCost h = unit_cost(cluster, s.pl, head_forward_ops(s.x), Recompute::kNone, plan.tp_overlap);
  out.embed_s = e.fwd.total() + e.bwd.total();
  out.head_s = h.fwd.total() + h.bwd.total();
  const ParallelConfig& par = plan.cfg.parallel;
  const parallel::StageWork work = parallel::stage_work(plan.cfg, int(s.pp), int(s.vpp));
  out.in_flight = parallel::validate(parallel::make_schedule(par.schedule, int(s.pp), int(s.m), int(s.vpp), false, work))
                      .peak_in_flight;
  return out;
}

std::vector<OpCost> op_costs(const SimPlan& plan, const ClusterSpec& cluster) {
  const Setup s = make_setup(plan, cluster);
  std::vector<OpCost> out;
  auto add = [&](const char* unit, const std::vector<Op>& ops, bool weights) {
    for (const Op& o : ops) {
      const UnitCost u = unit_cost(cluster, s.pl, {o}, Recompute::kNone, plan.tp_overlap, weights);
      out.push_back({unit, o.name, u.fwd.total(), u.bwd.total()});
    }
  };
  add("embedding", embedding_forward_ops(s.x), false);
  add("block", block_forward_ops(s.x), true);
  add("head", head_forward_ops(s.x), false);
  return out;
}

void take_context_parallel(SimPlan& plan) {
  const int64_t cp = plan.cfg.parallel.cp;
  if (cp <= 1) return;
  LOOM_CONFIG_CHECK(plan.cp <= 1 || plan.cp == cp, "--cp ", plan.cp, " but parallel.cp = ", cp, ": give one of them");
  plan.cp = cp, plan.cfg.parallel.cp = 1;
}

SimResult simulate(const SimPlan& plan, const ClusterSpec& cluster, bool record_events) {
  Setup s = make_setup(plan, cluster);
  build_chunks(s);
  SimResult res;
  res.gpus = plan.gpus();
  res.micro_batch = plan.cfg.micro_batch();
  res.micro_batches = s.m;
  std::vector<SimEvent>* events = record_events ? &res.events : nullptr;
  const std::vector<RankState> states = replay(s, events);
  for (int64_t r = 0; r < s.pp; ++r) res.ranks.push_back(finish_rank(s, r, states[size_t(r)], events));
  summarize(s, states, res);
  const ParallelConfig& q = plan.cfg.parallel;
  if (streams(q.schedule) && q.pp > 1 && q.sync_warmup_steps > 0) {  // Note [Synchronous warm-up]
    SimPlan flushing = plan;
    flushing.cfg.parallel.schedule = ScheduleKind::k1F1B;
    flushing.cfg.parallel.sync_warmup_steps = 0;
    res.warmup_steps = std::min(q.sync_warmup_steps, plan.cfg.train.steps);
    res.warmup_step_time_s = simulate(flushing, cluster, false).step_time_s;
  }
  return res;
}

}  // namespace loom::sim
