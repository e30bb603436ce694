#include "loom/sim/costs.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"

namespace loom::sim {

// Note [Cost model]
// A rank's work is a list of ops per block, embedding and head (the forward pass; the
// backward of a GEMM is two GEMMs of the same size, dX and dW; of a memory-bound kernel
// about twice its bytes; of a collective its conjugate of the same size: all-reduce <->
// all-reduce, all-gather <-> reduce-scatter, as Megatron's f/g pairs). An op costs
//   GEMM:    flops / (peak x gemm_efficiency(flops)) + launch overhead
//   memory:  bytes / (bandwidth x memory_efficiency(bytes)) + launch overhead
//   comm:    factor x bytes / busbw + steps x latency      (factor: all-reduce 2(n-1)/n,
//            all-gather / reduce-scatter (n-1)/n of the gathered whole, p2p 1)
// with busbw the intra-node link (x efficiency) for a group inside one node and, across
// nodes, min(intra, members-per-node x per-device NIC bandwidth x efficiency): NCCL
// drives one ring per NIC, so a group with k members per node moves its inter-node
// traffic over k NICs. A calibrated cluster's measured busbw table replaces the formula.
// The two efficiency curves and the tier efficiencies are the model's calibration
// constants: per device, sourced in the preset, never per run.
//
// The ops follow Megatron-LM's GPT layer (Korthikanti et al. 2022, Section 4.1): LN, QKV
// GEMM, QK^T, fused scale-mask-softmax, attention dropout, AV, projection, bias-dropout-
// add, LN, MLP (GELU; SwiGLU for Llama, whose layers have no dropout), bias-dropout-add;
// tp splits the GEMMs and attention heads, sp splits the elementwise rows and turns the
// two all-reduces into all-gather + reduce-scatter.

// The op names of calibrated bus-bandwidth tables (BusbwTable::op).
const char* busbw_name(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    default: return "p2p";
  }
}

LayerShape LayerShape::of(const ModelConfig& m, int64_t micro_batch, int64_t seq, int64_t tp, int64_t cp, bool sp,
                          int64_t dtype_bytes) {
  LayerShape x;
  x.arch = m.arch;
  x.b = double(micro_batch);
  x.s = double(seq);
  x.h = double(m.d_model);
  x.a = double(m.heads);
  x.g = double(m.kv_heads > 0 ? m.kv_heads : m.heads);
  x.f = double(m.ffn);
  x.V = double(m.vocab);
  x.t = double(tp);
  x.cp = double(cp);
  x.sp = sp && tp > 1;
  x.dropout = m.arch == Arch::kGpt;
  x.dtype_bytes = double(dtype_bytes);
  return x;
}

namespace {

// `batch` GEMMs of (M, K) x (K, N): 2 M N K FLOPs each; bytes = both inputs and the output
// (a roofline: attention's batched GEMMs with K = head dim are memory-bound on GPUs).
// Outside the attention core a GEMM is a linear layer (M rows of K in-features to N
// out-features): Note [GEMM width].
Op gemm(const char* name, double M, double N, double K, double dt, double batch = 1, bool core = false) {
  Op o{name, Op::Kind::kGemm, 2 * M * N * K * batch, (M * K + K * N + M * N) * dt * batch, OpKind::kAllReduce, Axis::kTp, core};
  if (!core) o.width = std::min(N, K);
  return o;
}
Op mem(const char* name, double bytes, bool core = false, MemClass cls = MemClass::kGeneric) {
  Op o{name, Op::Kind::kMemory, 0, bytes, OpKind::kAllReduce, Axis::kTp, core};
  o.mem_class = cls;
  return o;
}
// A residual add; in loom's engine its gradient is added by the norm's backward, no kernel.
Op residual(const char* name, double bytes, const LayerShape& x) {
  Op o = mem(name, bytes, false, MemClass::kResidual);
  o.backward = !x.fused_residual_grad;
  return o;
}
Op comm(const char* name, OpKind c, Axis axis, double bytes) {
  Op o{name, Op::Kind::kComm, 0, bytes, c, axis, false};
  return o;
}

// The tp collective after a row-parallel GEMM (all-reduce; reduce-scatter with sp) and
// before a column-parallel one under sp (all-gather), over the block's n x h activation.
void tp_out(std::vector<Op>& ops, const LayerShape& x, const char* name) {
  if (x.t > 1) ops.push_back(comm(name, x.sp ? OpKind::kReduceScatter : OpKind::kAllReduce, Axis::kTp, x.tokens() * x.h * x.dtype_bytes));
}
void tp_in(std::vector<Op>& ops, const LayerShape& x, const char* name) {
  if (x.sp) ops.push_back(comm(name, OpKind::kAllGather, Axis::kTp, x.tokens() * x.h * x.dtype_bytes));
}

// A block's linear layer: n rows of K in-features to N out-features. Note [fp8 GEMMs]: in an
// fp8 format its input is cast first (the cast's backward: the output gradient's), and the
// GEMM reads one-byte operands.
void linear(std::vector<Op>& ops, const LayerShape& x, const char* name, double N, double K) {
  const double n = x.tokens(), dt = x.dtype_bytes;
  Op o = gemm(name, n, N, K, dt);
  if (x.gemm_format != GemmFormat::kBf16) {
    Op cast = mem("fp8_cast", fp8_cast_bytes(x.gemm_format, n * K));
    cast.name = std::string(name) + "_fp8_cast";
    cast.backward_bytes = fp8_cast_bytes(x.gemm_format, n * N);
    ops.push_back(cast);
    o.fp8 = true;
    o.fp4 = x.gemm_format == GemmFormat::kNvfp4;
    o.bytes = operand_bytes(x.gemm_format, dt) * (n * K + K * N) + n * N * dt;
  }
  ops.push_back(o);
}

}  // namespace

// Note [fp8 GEMMs]
// Transformer Engine's fp8 training (Micikevicius et al. 2022, "FP8 Formats for Deep
// Learning") runs the transformer blocks' linear layers - qkv, the attention projection,
// fc1 (gate/up), fc2 - on fp8 operands: e4m3 activations and weights forward, e5m2 gradients
// backward, and dgrad and wgrad are fp8 GEMMs too. Each is priced as a GEMM at the device's
// fp8 peak x fp8_gemm_efficiency(FLOPs) (the bf16 curve's fraction where the device has no
// fp8 curve), reading one byte a value. What the format adds, per linear layer:
//  - each micro-batch, the cast of its input (n x in values) forward and of its output
//    gradient (n x out) backward. On Hopper an fp8 GEMM reads its operands only in the TN
//    layout, so a cast also writes the transpose that the other GEMM reads: read 2 bytes,
//    write 1 + 1, 4 bytes a value (TE's fused cast-transpose). Current scaling reads the
//    input once more for its amax first (+2). MXFP8 (Blackwell) writes the row- and
//    column-wise copies, each with one E8M0 scale per 32 values (+2/32).
//  - each step, the weights' cast (and transpose), once for all micro-batches (TE's weight
//    caching from the first micro-batch, as Megatron-core uses it): 4 bytes a weight at the
//    memory rate, priced with the optimizer's pass; the fp8 copy and its transpose (2 bytes
//    a weight) held through the step.
// Note [fp8 weights under ZeRO-3]: with the parameters sharded (FSDP, Megatron-FSDP, ZeRO-3)
// no rank holds a layer's weights between its passes, so there is nothing to cache: each
// forward and backward casts the unit it gathered (the cast and transpose, 4 bytes a weight as
// above, priced in the pass) and frees the copies with it, so a rank holds the fp8 copies of
// the two units its gather pool holds, not the whole stage's (Megatron-FSDP keeps the
// transposes only with keep_fp8_transpose_cache, off by default). With fp8 all-gathers
// (SimPlan::fp8_param_gather: Megatron's --fp8-param-gather, FSDP2's float8 all-gather) the
// gathers move the format's operand bytes (1 a weight for fp8 and MXFP8, 0.5625 for NVFP4),
// the forward computes on what arrived, and the backward only transposes it (read and write
// the operand bytes); the owner's cast of its shard after the update (1 / dp of the weights) is
// not priced.
// The inputs each layer saves for backward are its fp8 copies (Note [fp8 saved inputs] in
// memory_model.cc). Not modelled: the forward casts fused into the norm or activation before
// them (so the cast bytes are an upper bound) and the amax history update (a few values a
// tensor). Attention, norms, the
// embedding and the head stay bf16, as in Megatron-core's default recipe.
double fp8_cast_bytes(GemmFormat f, double elements) {
  switch (f) {
    case GemmFormat::kBf16: return 0;
    case GemmFormat::kFp8: return 4 * elements;
    case GemmFormat::kFp8Current: return 6 * elements;
    case GemmFormat::kMxfp8: return (4 + 2.0 / 32) * elements;
    case GemmFormat::kNvfp4: return (4 + 2 * (0.5 + 1.0 / 16)) * elements;
  }
  return 0;
}

// Note [NVFP4 GEMMs]
// NVIDIA's NVFP4 training recipe (NVIDIA, "Pretraining Large Language Models with NVFP4",
// arXiv 2509.25149, Sec. 4; Transformer Engine's NVFP4BlockScaling): the linear layers'
// forward, dgrad and wgrad GEMMs on E2M1 values (half a byte) with one E4M3 scale per 16
// values and one fp32 scale per tensor, at the device's dense fp4 peak x the fp8 curve's
// fraction (assumed: no Blackwell kernel was measured). Per cast of n bf16 values: an amax
// pass for the tensor scale (2 bytes a value), the cast's read (2) and its row- and
// column-wise copies (2 x (0.5 + 1/16)): (4 + 1.125) n; the wgrad operands' 16-point random
// Hadamard transform and the gradients' stochastic rounding are taken as fused into that
// cast. The weights' copies (16 x 16 blocks, one scale per 256) hold 2 x (0.5 + 1/256)
// bytes a weight. Not modelled: the recipe's few layers kept in bf16 (in the paper a small
// share of the blocks, mostly the last ones; which ones a published stack keeps is not stated).
double operand_bytes(GemmFormat f, double bf16_bytes) {
  switch (f) {
    case GemmFormat::kBf16: return bf16_bytes;
    case GemmFormat::kFp8:
    case GemmFormat::kFp8Current:
    case GemmFormat::kMxfp8: return 1;
    case GemmFormat::kNvfp4: return 0.5 + 1.0 / 16;
  }
  return bf16_bytes;
}

double weight_copy_bytes(GemmFormat f) {
  switch (f) {
    case GemmFormat::kBf16: return 0;
    case GemmFormat::kFp8:
    case GemmFormat::kFp8Current:
    case GemmFormat::kMxfp8: return 2;
    case GemmFormat::kNvfp4: return 2 * (0.5 + 1.0 / 256);
  }
  return 0;
}

namespace {

// Note [Context-parallel pricing]
// Each layer all-gathers K|V over the cp group before attention; backward sends dK|dV back
// (the conjugate reduce-scatter). loom's engine (parallel.cp_mode = allgather, Note
// [Context-parallel attention]) keeps no gathered copy between the passes, so its backward
// gathers again first; the GPU stacks' are priced without that.
// parallel.cp_mode = ulysses (Note [Ulysses attention]): an all-to-all sends this rank's
// rows of q, k and v to the rank whose heads they are and the output's back; each rank then
// attends all s rows for a / (t cp) heads (the same FLOPs). Backward: the conjugates
// (all-to-alls of dout and dqkv), and loom's engine sends q, k, v to heads again first.
void cp_before_attention(std::vector<Op>& ops, const LayerShape& x) {
  const double n = x.tokens(), dt = x.dtype_bytes, kv = x.g * (x.h / x.a);
  if (x.cp > 1 && x.cp_ulysses) {
    Op g = comm("cp_qkv_to_heads", OpKind::kAllToAll, Axis::kCp, n * (x.h + 2 * kv) / x.t * dt);
    g.regather = x.cp_regather;
    ops.push_back(g);
  } else if (x.cp > 1 && !x.cp_ring) {
    Op g = comm("cp_kv_gather", OpKind::kAllGather, Axis::kCp, 2 * n * x.cp * kv / x.t * dt);
    g.regather = x.cp_regather;
    ops.push_back(g);
  }
}

// Note [Context-parallel copies]
// loom's engine moves rows between its layouts around each cp collective (model/
// context_parallel.cc, ring_attention.cc, ulysses.cc); per layer, in units of one rank's rows
// of a width (n w dt / t bytes; w2 = 2 kv, the K|V columns, w3 = h + 2 kv, all of qkv):
//   allgather  forward: K|V columns out of qkv (read + write, 2 w2), the gathered blocks into
//              position order (2 cp w2); backward: the same again (it gathers again), dK|dV
//              zeroed (cp w2), put back in rank order (2 cp w2), the own block added (3 w2):
//              2 (1 + cp) w2 and 5 (1 + cp) w2;
//   ring       forward: K|V columns (2 w2), the accumulator zeroed (h) and normalised (2 h);
//              backward: rowsum(dO O) (2 h), two dK|dV blocks zeroed (2 w2), K|V columns
//              (2 w2), the own block's gradient added (3 w2): 2 w2 + 3 h and 7 w2 + 2 h;
//   ulysses    each pass to heads or to rows packs and unpacks its rows (2 + 2 of its width;
//              an unpack that adds, 3): forward qkv to heads (4 w3), out to rows (4 h);
//              backward qkv and dO to heads (4 w3 + 4 h), dqkv zeroed (w3), to rows adding
//              (5 w3): 4 w3 + 4 h and 10 w3 + 4 h.
// Memory-bound work the kernels' pricing does not hold: on config B at cp 2 (allgather) it
// measured 6.3 ms a step (the copies timed in place, 20 steps) against 0.30 s.
Op cp_copies(const LayerShape& x) {
  const double unit = x.tokens() * x.dtype_bytes / x.t, w2 = 2 * x.g * (x.h / x.a), w3 = x.h + w2;
  double fwd = 0, bwd = 0;
  if (x.cp_ulysses) fwd = 4 * w3 + 4 * x.h, bwd = 10 * w3 + 4 * x.h;
  else if (x.cp_ring) fwd = 2 * w2 + 3 * x.h, bwd = 7 * w2 + 2 * x.h;
  else fwd = 2 * (1 + x.cp) * w2, bwd = 5 * (1 + x.cp) * w2;
  Op o = mem("cp_copies", fwd * unit);
  o.backward_bytes = bwd * unit;
  return o;
}

// Note [Ring attention pricing]
// loom's ring (parallel.cp_mode = ring, Note [Ring attention]) shifts each rank's K|V block
// (n 2 kv / t values) cp - 1 times while the attention kernel computes on the block it
// holds: those shifts cost what the kernel's time does not cover, and where it covers them
// the compute their progress takes from the kernel (overlapped_s, Note [Overlap contention]:
// the group's worker drives the transfer beside it; 0 on devices with no overlap_cost);
// backward shifts the blocks again under its kernel (2.5x the forward's: it recomputes the
// scores from each row's log-sum-exp) and each block's dK|dV cp times after the step that
// wrote it (exposed).
// Priced after the attention op, whose time the pass hands to it. The kernel itself is cp
// calls, one a step over the s / cp keys it brought, each priced at the calibrated attention
// curve's efficiency for its own FLOPs (the per-chunk efficiency: smaller calls run slower).
void cp_after_attention(std::vector<Op>& ops, const LayerShape& x) {
  const double n = x.tokens(), dt = x.dtype_bytes, kv = x.g * (x.h / x.a);
  if (x.cp > 1 && x.cp_ulysses) ops.push_back(comm("cp_out_to_rows", OpKind::kAllToAll, Axis::kCp, n * x.h / x.t * dt));
  if (x.cp > 1 && x.cp_ring) {
    Op g = comm("cp_ring_kv", OpKind::kSend, Axis::kCp, 2 * n * kv / x.t * dt);
    g.ring_steps = int(x.cp);
    ops.push_back(g);
  }
  if (x.cp > 1 && x.cp_regather) ops.push_back(cp_copies(x));
}

}  // namespace

std::vector<Op> block_forward_ops(const LayerShape& x) {
  const double n = x.tokens(), ne = x.sp ? n / x.t : n, dt = x.dtype_bytes;
  const double kv = x.g * (x.h / x.a);  // key/value width (GQA: g heads of h/a)
  const bool gpt = x.arch == Arch::kGpt;
  const double probs = n * x.s * x.a / x.t;  // attention scores this rank holds: (b, a/t, s/cp, s)
  std::vector<Op> ops;
  ops.push_back(mem("norm1", 2 * ne * x.h * dt, false, MemClass::kNorm));
  tp_in(ops, x, "sp_gather1");
  linear(ops, x, "qkv", (x.h + 2 * kv) / x.t, x.h);
  cp_before_attention(ops, x);
  // (b, a/t) GEMMs of (s/cp, hd) x (hd, s); ulysses: (b, a/(t cp)) of (s, hd) x (hd, s)
  const double hd = x.h / x.a, heads = x.b * x.a / x.t / (x.cp_ulysses ? x.cp : 1),
               rows = x.cp_ulysses ? x.s : x.s / x.cp;
  if (x.flash()) {
    // Dao et al.: the causal half of QK^T and PV in SRAM tiles; reads Q, K, V, writes the
    // output and the row log-sum-exp. FLOPs are the causal half of the full product.
    // Note [Flash under context parallelism]: with cp > 1 a rank's s / cp queries meet the
    // keys in cp ring steps (Megatron-core's context parallelism, Liu et al. 2023 ring
    // attention, with the causal load balancing of two chunks a rank), one flash call a step
    // over the s / cp keys that step brought; the same FLOPs, but each call's tiles sweep
    // s / cp keys, so the kernel runs at the efficiency the curve gives for that length.
    Op a = gemm("flash_attention", rows, x.s, hd, dt, heads, true);
    a.kind = Op::Kind::kAttention;
    a.kernel = x.attention;
    a.seq = x.cp_ulysses ? x.s : x.s / x.cp;  // Note [Flash under context parallelism]
    a.head_dim = hd;
    a.bytes = 2 * n * (x.h + 2 * kv) / x.t * dt + n * x.a / x.t * 4;
    ops.push_back(a);
  } else if (x.fused_attention) {
    // loom's ring (Note [Ring attention]) keeps each row's log-sum-exp, not P, and its
    // backward recomputes the scores (priced in add_backward).
    const bool ring = x.cp > 1 && x.cp_ring;
    Op a = gemm(ring ? "ring_attention" : "attention", rows, x.s, hd, dt, heads, true);
    a.kind = Op::Kind::kAttention;
    a.flops *= 2;  // QK^T and PV
    a.bytes = (ring ? n * x.a / x.t * 4 : probs * dt) + 2 * n * (x.h + 2 * kv) / x.t * dt;
    // Note [Ring attention pricing]: one kernel call a ring step, each over the s / cp keys
    // that step brought, at the curve's efficiency for that call's size.
    if (ring) a.calls = int(x.cp);
    ops.push_back(a);
  } else {
    ops.push_back(gemm("scores", rows, x.s, hd, dt, heads, true));
    ops.push_back(mem("softmax", 2 * probs * dt, true));
    if (x.dropout) ops.push_back(mem("attn_dropout", probs * (2 * dt + 1), true));
    ops.push_back(gemm("attn_v", rows, hd, x.s, dt, heads, true));
  }
  cp_after_attention(ops, x);
  linear(ops, x, "proj", x.h, x.h / x.t);
  tp_out(ops, x, "tp_reduce1");
  ops.push_back(residual("residual1", ne * x.h * (3 * dt + (x.dropout ? 1 : 0)), x));
  ops.push_back(mem("norm2", 2 * ne * x.h * dt, false, MemClass::kNorm));
  tp_in(ops, x, "sp_gather2");
  if (gpt) {
    linear(ops, x, "fc1", x.f / x.t, x.h);
    ops.push_back(mem("gelu", 2 * n * x.f / x.t * dt, false, MemClass::kActivation));
  } else {
    linear(ops, x, "gate_up", 2 * x.f / x.t, x.h);
    ops.push_back(mem("swiglu", 3 * n * x.f / x.t * dt, false, MemClass::kActivation));
  }
  linear(ops, x, "fc2", x.h, x.f / x.t);
  tp_out(ops, x, "tp_reduce2");
  ops.push_back(residual("residual2", ne * x.h * (3 * dt + (x.dropout ? 1 : 0)), x));
  return ops;
}

std::vector<Op> embedding_forward_ops(const LayerShape& x) {
  const double n = x.tokens(), ne = x.sp ? n / x.t : n, dt = x.dtype_bytes;
  std::vector<Op> ops;
  // Vocab-parallel lookup: each tp rank writes the rows of its vocabulary slice (zeros
  // elsewhere), then the partial sums are reduced (reduce-scattered under sp).
  ops.push_back(mem("embed_lookup", (x.arch == Arch::kGpt ? 3 : 2) * n * x.h * dt));
  if (x.vocab_split) tp_out(ops, x, "embed_reduce");  // whole table: every rank looks up every row
  if (x.dropout) ops.push_back(mem("embed_dropout", ne * x.h * (2 * dt + 1)));
  return ops;
}

std::vector<Op> head_forward_ops(const LayerShape& x) {
  const double n = x.tokens(), ne = x.sp ? n / x.t : n, dt = x.dtype_bytes;
  std::vector<Op> ops;
  ops.push_back(mem("final_norm", 2 * ne * x.h * dt, false, MemClass::kNorm));
  tp_in(ops, x, "sp_gather_head");
  ops.push_back(gemm("logits", n, x.V / x.vocab_t(), x.h, dt));
  // Cross-entropy in fp32: read the logits, max, exp-sum, the target's logit; vocab-parallel
  // adds three small all-reduces of n floats (fused into one here).
  ops.push_back(mem("cross_entropy", n * x.V / x.vocab_t() * (dt + 3 * 4)));
  if (x.vocab_split && x.t > 1) ops.push_back(comm("ce_reduce", OpKind::kAllReduce, Axis::kTp, 3 * n * 4));
  return ops;
}

ParamCount block_params(const ModelConfig& m, int64_t tp) {
  const double h = double(m.d_model), f = double(m.ffn), t = double(tp);
  const double kv = double(m.kv_heads > 0 ? m.kv_heads : m.heads) * double(m.head_dim());
  if (m.arch == Arch::kGpt) {
    // norms 2 x (2h); qkv (h, 3h) + 3h and fc1 (h, f) + f column-parallel; proj (h, h) and
    // fc2 (f, h) row-parallel with their h biases replicated.
    const double col = h * 3 * h + 3 * h + h * f + f, row = h * h + f * h, rep = 4 * h + 2 * h;
    return {col + row + rep, (col + row) / t + rep};
  }
  // RMSNorm 2 x h; q (h, h), k/v (h, kv) and gate/up (h, 2f) column-, o and down row-parallel.
  const double split = h * h + 2 * h * kv + 2 * h * f + h * h + f * h, rep = 2 * h;
  return {split + rep, split / t + rep};
}

std::vector<double> block_tensors(const ModelConfig& m, int64_t tp) {
  const double h = double(m.d_model), f = double(m.ffn), t = double(tp);
  if (m.arch == Arch::kGpt)
    return {h, h, 3 * h * h / t, 3 * h / t, h * h / t, h, h, h, h * f / t, f / t, f * h / t, h};
  const double kv = double(m.kv_heads > 0 ? m.kv_heads : m.heads) * double(m.head_dim());
  return {h, h * h / t, h * kv / t, h * kv / t, h * h / t, h, h * f / t, h * f / t, f * h / t};
}

ParamCount embedding_params(const ModelConfig& m, int64_t tp) {
  const double h = double(m.d_model), V = double(m.vocab);
  const double pos = m.arch == Arch::kGpt ? double(m.ctx) * h : 0;  // learned positions, replicated
  return {V * h + pos, V * h / double(tp) + pos};
}

ParamCount head_params(const ModelConfig& m, int64_t tp) {
  const double h = double(m.d_model), V = double(m.vocab);
  if (m.arch == Arch::kGpt) return {2 * h, 2 * h};  // final LayerNorm; the head is the tied embedding
  return {h + V * h, h + V * h / double(tp)};
}

double total_params(const ModelConfig& m) {
  return double(m.layers) * block_params(m, 1).whole + embedding_params(m, 1).whole + head_params(m, 1).whole;
}

double model_flops_per_sequence(const ModelConfig& m, int64_t seq, bool causal_attention) {
  LayerShape x = LayerShape::of(m, 1, seq, 1, 1, false, 2);
  if (causal_attention) x.attention = Attention::kFlash2;
  double fwd = 0;
  for (const Op& o : block_forward_ops(x)) fwd += o.flops * double(m.layers);
  for (const Op& o : head_forward_ops(x)) fwd += o.flops;
  return 3 * fwd;
}

GroupShape place_group(const ClusterSpec& c, int64_t ranks, int64_t stride) {
  return comm::place_group(c.devices_per_node, ranks, stride);
}

// Note [GEMM width]
// A GEMM's rate depends on its shape, not only its FLOPs: a linear layer of a narrow model
// (tokens x 256 in-features x 768 out) has the FLOPs of a wide square GEMM but streams its
// output tile through the micro-kernel more often per FLOP (a short inner dimension, or a
// narrow output panel). On this VM's 2 cores (OpenBLAS, fp32, operands cold as in a step)
// (2048, 256, 768) and (2048, 1024, 256) ran at 408-420 GFLOP/s where the FLOPs-indexed
// curve, measured on wide shapes at those FLOPs, said 445 (docs/log/benchmarks.md); inside a
// step of config A its four GEMMs per layer took 10-13% more than that curve priced
// (LOOM_KERNEL_PROFILE). So `loom calibrate` also times a linear layer's two shapes,
// (n, w, 4w) and (n, 4w, w), over a grid of widths w and token counts n, and a device that
// has the table prices a linear layer's GEMM (forward, and through it the backward's two)
// at e(min(in, out), FLOPs) from it; other GEMMs (attention's batched ones, GPU presets)
// keep the FLOPs curve.
double gemm_time_s(const DeviceSpec& d, double flops, double bytes, double width, bool fp8, bool fp4) {
  if (flops <= 0) return 0;
  if (fp8) {  // Note [fp8 GEMMs], Note [NVFP4 GEMMs]
    const double peak = fp4 ? d.fp4_peak_flops : d.fp8_peak_flops;
    LOOM_ASSERT(peak > 0);
    const Curve& c = d.fp8_gemm_efficiency.points.empty() ? d.gemm_efficiency : d.fp8_gemm_efficiency;
    const double memory = bytes > 0 ? bytes / (d.memory_bw * d.memory_efficiency.at(bytes)) : 0;
    return std::max(flops / (peak * c.at(flops)), memory) + d.kernel_overhead_s;
  }
  const double e = width > 0 && !d.gemm_width_efficiency.empty() ? d.gemm_width_efficiency.at(width, flops)
                                                                  : d.gemm_efficiency.at(flops);
  const double compute = flops / (d.peak_flops * e);
  const double memory = bytes > 0 ? bytes / (d.memory_bw * d.memory_efficiency.at(bytes)) : 0;
  return std::max(compute, memory) + d.kernel_overhead_s;
}

double memory_time_s(const DeviceSpec& d, double bytes) {
  if (bytes <= 0) return 0;
  return bytes / (d.memory_bw * d.memory_efficiency.at(bytes)) + d.kernel_overhead_s;
}

// Note [Overlap contention]
// A collective overlapped with compute is not free: it runs on the same device. On a GPU its
// kernels hold SMs and HBM bandwidth the GEMMs beside them would use; Lee et al. 2025
// ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
// Learning", arXiv 2507.03114, abstract) measured compute slowed by 18.9% on average (40% at
// most) while communication ran beside it, over GPT and Llama training on A100, H100, MI250
// and MI210. On loom's CPU engine the collectives' copies and reductions run on the cores the
// ranks compute on (a worker thread per group), so with a rank per core every second of
// collective work is taken from compute, and more (the switches between the two threads);
// `loom calibrate` measures it (Note [Calibration]). The device's overlap_cost kappa is the
// compute time lost per second of collective, and a collective of X seconds beside a window
// of W seconds of compute adds
//   max(X - W, kappa x min(X, W))
// to the window: the part of the collective the window cannot cover, or the compute it slows.
// A GPU slowed by sigma while the collective runs has kappa = sigma / (1 + sigma) (compute
// progresses at 1 / (1 + sigma) for X seconds): 0.159 for the 18.9% average. With kappa = 0
// this is the former max(0, X - W) - perfect hiding.
double overlapped_s(const DeviceSpec& d, double comm_s, double window_s) {
  if (comm_s <= 0) return 0;
  return std::max(comm_s - window_s, d.overlap_cost * std::min(comm_s, std::max(0.0, window_s)));
}

// Note [Fused attention kernels]
// A flash kernel's speed is set by how well its tiles keep the tensor cores fed, which grows
// with the sequence its rows sweep (short sequences are dominated by the causal diagonal's
// partial tiles and the softmax's non-matmul work), not by its total FLOPs: a device preset
// gives, per kernel, the fraction of peak a causal forward + backward reaches by sequence
// length (head dim 128), counted as the papers count it (backward = 2.5 x forward FLOPs,
// which is what the backward pass is priced at):
//   t_fwd = F / (peak x e(s)),  t_bwd = 2.5 F / (peak x e(s)),  F = the causal half.
// Sources in the presets: FlashAttention-1 reaches 25-40% of A100 peak and FlashAttention-2
// 50-73% (Dao 2023, FlashAttention-2, abstract); FlashAttention-2 ~35% of H100's (Shah et al.
// 2024, FlashAttention-3, abstract); the Hopper kernels (FlashAttention-3; cuDNN's, which
// Transformer Engine runs) up to 75%. A generation the preset has no curve for takes the
// next older one's (FlashAttention-3 is Hopper-only: flash3 on A100 runs as flash2), and
// below flash1 the GEMM roofline. Frameworks choose their kernel (Note [Published frameworks]).
//
// Head size: the curves are at head dim 128. FlashAttention-1 and -2 compute a tile's
// softmax exponentials between its two matmuls on the special-function units, not beside
// them (the Hopper kernels overlap the two: Shah et al. 2024, FlashAttention-3, which also
// gives the H100's rates: 989 TFLOP/s of matmul against 3.9 TFLOP/s of special functions).
// Per (batch, head) a causal forward + backward takes s^2 exponentials (s^2 / 2 each way,
// the backward recomputing P) against 7 s^2 hd matmul FLOPs (2 s^2 hd forward, 2.5x that
// backward), so exponentials add r(hd) = peak e / (7 hd sfu) of the matmul time, and a head
// dim other than 128 scales the time by (1 + r(hd)) / (1 + r(128)): on H100 at e = 0.35,
// r(128) = 0.10 and r(64) = 0.20, so hd 64 runs 9% slower per FLOP (measured on a lent H100,
// PyTorch's FlashAttention-2: 10%). The Hopper kernels overlap the exponentials with the
// matmuls but do not hide them at small heads: cuDNN's fused attention ran head dim 64 at
// 0.81-0.83 of its head-dim-128 rate per FLOP on the same H100 (bench/cuda_kernel_curves.py,
// every length 512-32k), so a device measures that ratio (flash3_head_dim_rate, by head dim)
// and a flash3 op's time is scaled by rate(128) / rate(hd); without it, by 1.
namespace {
const Curve* flash_curve(const DeviceSpec& d, Attention k) {
  for (int g = int(k); g >= 1; --g)
    if (!d.flash_efficiency[g].points.empty()) return &d.flash_efficiency[g];
  return nullptr;
}

double head_dim_factor(const DeviceSpec& d, Attention k, double e, double hd) {
  if (hd <= 0) return 1.0;
  if (k == Attention::kFlash3) {
    const Curve& r = d.flash3_head_dim_rate;
    return r.points.empty() ? 1.0 : r.at(128) / r.at(hd);
  }
  if (d.special_function_rate <= 0) return 1.0;
  auto r = [&](double h) { return d.peak_flops * e / (7 * h * d.special_function_rate); };
  return (1 + r(hd)) / (1 + r(128));
}
}  // namespace

// Note [Memory-bound kernel classes]
// One memory curve averages kernels that differ per byte by several times: loom's GELU
// evaluates a tanh per element and its layer norm makes two passes per row (one for the
// statistics), while a residual add streams three arrays once; inside a step each writes
// its output into an activation buffer last touched a layer ago. Measured inside a step of
// config A (LOOM_KERNEL_PROFILE, docs/log/benchmarks.md) the norms, GELU and residual adds took
// 3-4x what the averaged, hot-buffer curve charged. So `loom calibrate` times each class
// (norm: layer norm; activation: GELU; residual: the add) forward and backward with cold
// outputs and saved inputs, and a device that has a class's curves prices its ops by them:
//   t_fwd = bytes / (memory_bw x e_class(bytes)),   t_bwd = b_class(bytes) x t_fwd,
// where bytes are the forward's as the op counts them. Without them the averaged curve
// prices the forward and a backward moving twice the bytes. loom's residual adds have no
// backward kernel (the norms' backward adds the residual's gradient into dx).
double memory_class_time_s(const DeviceSpec& d, const Op& op, bool backward) {
  const int k = int(op.mem_class);
  if (op.mem_class == MemClass::kGeneric || d.class_efficiency[k].points.empty() || op.bytes <= 0)
    return backward ? memory_time_s(d, 2 * op.bytes) : memory_time_s(d, op.bytes);
  const double fwd = op.bytes / (d.memory_bw * d.class_efficiency[k].at(op.bytes)) + d.kernel_overhead_s;
  if (!backward) return fwd;
  return d.class_backward[k].points.empty() ? 2 * fwd : d.class_backward[k].at(op.bytes) * fwd;
}

double kernel_time_s(const DeviceSpec& d, const Op& op) {
  if (op.kind == Op::Kind::kAttention && op.kernel != Attention::kUnfused)
    if (const Curve* c = flash_curve(d, op.kernel)) {
      const double e = c->at(op.seq);
      return op.flops / (d.peak_flops * e) * head_dim_factor(d, op.kernel, e, op.head_dim) + d.kernel_overhead_s;
    }
  if (op.kind == Op::Kind::kAttention && !d.attention_efficiency.points.empty()) {
    const double per_call = op.flops / op.calls;
    return op.calls * (per_call / (d.peak_flops * d.attention_efficiency.at(per_call)) + d.kernel_overhead_s);
  }
  if (op.kind == Op::Kind::kGemm || op.kind == Op::Kind::kAttention)
    return gemm_time_s(d, op.flops, op.bytes, op.width, op.fp8, op.fp4);
  return memory_class_time_s(d, op, false);
}

double collective_time_s(const ClusterSpec& c, OpKind op, double bytes, const GroupShape& g) {
  if (g.ranks <= 1 || bytes <= 0) return 0;
  const std::string name = busbw_name(op);
  const double wait = c.device.oversubscribed_sync_s;  // Note [Oversubscribed cores]; 0 unless ranks > cores
  for (const BusbwTable& t : c.busbw)
    if (t.op == name && t.ranks == g.ranks) return wait + comm::bus_factor(op, g.ranks) * bytes / (t.gbps.at(bytes) * 1e9);
  return wait + comm::nccl_collective_s(op, bytes, g, {c.intra.bw * c.intra.efficiency, c.intra.latency_s},
                                        {c.inter.bw * c.inter.efficiency, c.inter.latency_s});
}

}  // namespace loom::sim
