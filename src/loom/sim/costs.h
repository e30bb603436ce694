// The cost model: what one transformer layer, the embedding and the head do on one rank
// (an op list with FLOPs, bytes and collectives), what each op costs on a device, and
// what a collective costs on a group placed over the cluster (Note [Cost model]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/cost.h"
#include "loom/core/config.h"
#include "loom/sim/cluster.h"

namespace loom::sim {

// Collectives and group shapes are comm's own types, priced by its formula library.
using comm::GroupShape;
using comm::OpKind;  // kAllReduce, kAllGather, kReduceScatter; kSend: a pipeline p2p message

// Which fused attention kernel the framework runs (Note [Fused attention kernels] in
// costs.cc): none (Megatron-LM 2021-22: QK^T, softmax, dropout and PV as separate kernels
// over the (s, s) scores), FlashAttention-1 (and the Triton kernels of its time),
// FlashAttention-2, or a Hopper kernel (FlashAttention-3, and cuDNN's fused attention as
// Transformer Engine runs it). The value is the flash generation (DeviceSpec::flash_efficiency).
enum class Attention { kUnfused = 0, kFlash1 = 1, kFlash2 = 2, kFlash3 = 3 };

// The format of the transformer blocks' linear-layer GEMMs (core/config_enums.h; Note [fp8
// GEMMs] in costs.cc). Attention, norms, the embedding and the head stay bf16.
using loom::GemmFormat;
// --precision's text; throws ConfigError naming the choices.
inline GemmFormat parse_gemm_format(const std::string& name) { return loom::parse_gemm_format("--precision", name); }

// Which mesh axis a collective runs over (Note [Mesh order]: tp innermost, then cp, dp, pp).
enum class Axis { kTp, kCp, kDp, kPp };

// One kernel (or collective) of a forward pass on one rank.
struct Op {
  enum class Kind { kGemm, kMemory, kComm, kAttention };  // kAttention: one fused kernel (loom's)
  std::string name;
  Kind kind = Kind::kMemory;
  double flops = 0;           // kGemm: one GEMM's FLOPs (batched GEMMs: the batch's total)
  double bytes = 0;           // kGemm, kMemory: bytes read + written; kComm: the full buffer per rank
  OpKind coll = OpKind::kAllReduce;  // kComm only
  Axis axis = Axis::kTp;
  bool attention_core = false;  // recomputed by selective recompute (Korthikanti et al.)
  // kComm over cp: backward gathers again before its conjugate (Note [Context-parallel
  // pricing]: loom's allgather context parallelism keeps no gathered K|V).
  bool regather = false;
  // kComm over cp, loom's ring attention (Note [Ring attention pricing]): `bytes` is one K|V
  // block, shifted ring_steps - 1 times under the attention kernel (forward and backward)
  // and, with its gradient, ring_steps times after it in backward.
  int ring_steps = 0;
  Attention kernel = Attention::kUnfused;  // kAttention: a flash kernel is priced by its curve at `seq`
  double seq = 0;                          // kAttention: the key length its tiles sweep
  int calls = 1;  // kAttention on a calibrated curve: the kernel calls it runs as, flops / calls each
  double head_dim = 0;                     // kAttention: h / a
  MemClass mem_class = MemClass::kGeneric;  // kMemory: Note [Memory-bound kernel classes]
  bool backward = true;  // kMemory: has a backward kernel of its own (loom's residual adds do not)
  double width = 0;       // kGemm of a linear layer: min(in, out features) (Note [GEMM width]); 0: other GEMMs
  bool fp8 = false;       // kGemm: runs at the device's fp8 rate, forward and backward (Note [fp8 GEMMs])
  bool fp4 = false;       // kGemm with fp8: at the device's fp4 rate instead (Note [NVFP4 GEMMs])
  double backward_bytes = -1;  // kMemory: the backward kernel's bytes when >= 0 (else about twice the forward's)
};

// The shape one rank works on: micro-batch b, sequence s (whole), hidden h, heads a, kv
// heads g, ffn f, vocabulary V, tensor-parallel t, context-parallel cp, sequence parallel.
struct LayerShape {
  Arch arch = Arch::kGpt;
  double b = 1, s = 1, h = 1, a = 1, g = 1, f = 1, V = 1;
  double t = 1, cp = 1;
  bool sp = false;
  bool cp_regather = false;  // Note [Context-parallel pricing]: loom's engine (--framework loom)
  bool cp_ulysses = false;   // parallel.cp_mode = ulysses: all-to-all to heads (Note [Ulysses attention])
  bool cp_ring = false;      // loom's parallel.cp_mode = ring (Note [Ring attention pricing])
  bool dropout = true;          // Megatron's GPT layers have dropout; Llama and loom's engine none
  bool fused_attention = false; // loom's engine: QK^T, softmax and PV in one kernel
  bool fused_residual_grad = false;  // loom's engine: the norms' backward adds the residual's gradient
  Attention attention = Attention::kUnfused;  // flash: causal tiles only, no (s, s) scores kept
  bool vocab_split = true;      // under tp: embedding/head split by vocabulary (else whole per rank)
  double vocab_t() const { return vocab_split ? t : 1; }
  bool flash() const { return attention != Attention::kUnfused; }
  double dtype_bytes = 2;
  GemmFormat gemm_format = GemmFormat::kBf16;  // the block's linear layers (Note [fp8 GEMMs])
  static LayerShape of(const ModelConfig& m, int64_t micro_batch, int64_t seq, int64_t tp, int64_t cp, bool sp,
                       int64_t dtype_bytes);
  double tokens() const { return b * s / cp; }  // token rows this rank's cp slice holds
};

// Forward ops of one transformer block, of the embedding and of the head + loss.
std::vector<Op> block_forward_ops(const LayerShape& x);
std::vector<Op> embedding_forward_ops(const LayerShape& x);
std::vector<Op> head_forward_ops(const LayerShape& x);

// Parameters of one block / the embedding (incl. learned positions) / the head + final
// norm: whole-model counts and what one tp rank holds (replicated norms and row-parallel
// biases counted in full, as Megatron stores them). GPT ties the head to the embedding:
// head() then counts only the final norm.
struct ParamCount {
  double whole = 0, per_tp_rank = 0;
};
ParamCount block_params(const ModelConfig& m, int64_t tp);
// One block's parameter tensors as one tp rank holds them, in module order (GPT: ln1 w, b;
// qkv w, b; proj w, b; ln2 w, b; fc1 w, b; fc2 w, b. Llama: norm1; q, k, v, o; norm2; gate,
// up, down); they sum to block_params(m, tp).per_tp_rank.
std::vector<double> block_tensors(const ModelConfig& m, int64_t tp);
ParamCount embedding_params(const ModelConfig& m, int64_t tp);
ParamCount head_params(const ModelConfig& m, int64_t tp);
double total_params(const ModelConfig& m);

// Model FLOPs of one training step (forward + backward = 3x forward, no recompute): the
// MFU numerator, counted from the same op lists the simulator charges.
// With `causal_attention` (flash attention, which skips the masked half) attention counts
// its causal half, so MFU stays a fraction of what the hardware could do.
double model_flops_per_sequence(const ModelConfig& m, int64_t seq, bool causal_attention = false);

// Where a group of `ranks` members at global-rank stride `stride` lies on the cluster.
GroupShape place_group(const ClusterSpec& c, int64_t ranks, int64_t stride);

// Seconds for one kernel of the op on the device (GEMM: the slower of its FLOPs at the
// size's efficiency and its bytes at the bandwidth's; memory-bound: bytes at the
// bandwidth's efficiency; a flash kernel: its FLOPs at its curve's efficiency for the
// sequence length; each plus the launch overhead).
double kernel_time_s(const DeviceSpec& d, const Op& op);
// A memory-bound op's forward or backward (Note [Memory-bound kernel classes]).
double memory_class_time_s(const DeviceSpec& d, const Op& op, bool backward);
// `width`: a linear layer's narrower feature count (Op::width; 0: priced by FLOPs alone).
// `fp8` / `fp4`: at the device's fp8 / fp4 peak (Note [fp8 GEMMs], Note [NVFP4 GEMMs]).
double gemm_time_s(const DeviceSpec& d, double flops, double bytes, double width = 0, bool fp8 = false,
                   bool fp4 = false);
// Note [fp8 GEMMs]: bytes one cast of `elements` bf16 values moves in `f` (read, the fp8
// copy and its transpose, an amax pass, block scales).
double fp8_cast_bytes(GemmFormat f, double elements);
// Bytes a GEMM operand value takes in `f` (2 in bf16, 1 in fp8 and MXFP8, 0.5 + 1/16 in NVFP4).
double operand_bytes(GemmFormat f, double bf16_bytes);
// Bytes a weight's low-precision copies held through the step take (the copy and its
// transpose; 0 in bf16).
double weight_copy_bytes(GemmFormat f);
double memory_time_s(const DeviceSpec& d, double bytes);
// What a collective of comm_s seconds run beside window_s seconds of compute adds to the
// window (Note [Overlap contention]): max(comm - window, overlap_cost x min(comm, window)).
double overlapped_s(const DeviceSpec& d, double comm_s, double window_s);
// Seconds for one collective whose full buffer is `bytes` per rank (all_reduce: the
// reduced buffer; all_gather/reduce_scatter: the gathered whole; p2p: the message).
// A calibrated bus-bandwidth table for the op and group size wins over the formula.
double collective_time_s(const ClusterSpec& c, OpKind op, double bytes, const GroupShape& g);

// The gradient sync of pipeline rank `pp_rank` under a stateful compressor (top-k,
// TernGrad, PowerSGD; Note [Gradient compressors]) or Adasum: its collectives and its encode/decode
// passes, priced from parallel::bucket_traffic over the rank's tensors, run after backward
// (not overlapped, as the engine runs them).
struct CompressedSync {
  double comm_s = 0, compute_s = 0;
  double wire_bytes = 0, exact_wire_bytes = 0;  // per rank per step, as the engine reports them
};
CompressedSync compressed_sync(const ClusterSpec& c, const Config& cfg, int64_t pp_rank, const GroupShape& dp);

}  // namespace loom::sim
