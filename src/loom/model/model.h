// GPT-2 and Llama forward/backward over flat parameter and gradient buffers.
//
// GPT-2 block (pre-LN):  x1 = x0 + Proj(Attn(LN1(x0)));  x2 = x1 + W2 GELU(W1 LN2(x1) + b1) + b2
// Llama block:           x1 = x0 + Wo Attn(RoPE(Wqkv RMS1(x0)));  x2 = x1 + Wd (silu(Wg h) * (Wu h)), h = RMS2(x1)
// Loss: mean over the B*T tokens of softmax cross-entropy of head(normf(x_L)).
//
// Note [Tensor parallel]
// With part.tp = t > 1 (Megatron-LM), each block is two conjugate pairs per sub-layer:
//   attention: Q,K,V = LN1(x) Wqkv_i (column-parallel: rank i holds heads H/t, KV/t);
//              y = sum_i Attn_i Wo_i (row-parallel: Wo split by input columns) -> all-reduce;
//   MLP:       h_i = act(LN2(x1) W1_i) (column-parallel);  y = sum_i h_i W2_i -> all-reduce.
// Forward all-reduces the row-parallel outputs (the bias is added once, by rank 0); backward
// all-reduces dL/d(norm output) after the column-parallel input gradient. Norms, biases of
// row-parallel layers and wpe are replicated and get identical gradients on every rank.
// Embedding and head are vocab-parallel: rank i holds vocabulary rows [i V/t, (i+1) V/t)
// (V padded to a multiple of t; padded logits are masked out), the embedding all-reduces
// its lookups and the cross-entropy all-reduces per-row max, sum of exp and target logit,
// so no rank ever holds (tokens x vocab) logits.
//
// Note [Sequence parallel]
// With opt.sp (Korthikanti et al.), the residual stream between the tensor-parallel
// regions is split over tp along the token rows: rank r holds rows [r N/t, (r+1) N/t) of
// the (N = B*T, C) activations (for B = 1 exactly a sequence split; every op there works
// per token). Norms run on the own rows and are all-gathered into the column-parallel
// input; row-parallel outputs are reduce-scattered instead of all-reduced (bias then added
// by every rank to its rows); backward mirrors it. Norm weights see only their rows, so
// their gradients are summed over tp per micro-batch. Pipeline stages exchange the shards.
//
// Note [B/W split]
// Zero-bubble pipelines (Qi et al., ICLR 2024) split a chunk's backward into B, which makes
// the input gradients (what the previous stage waits for), and W, which makes the weight
// gradients of the four linear layers per block (dW = dY^T X, db = colsum dY) and can run
// later. B runs everything the joint backward runs except those GEMMs (norm weights,
// embedding and head gradients included) and keeps each linear's upstream gradient dY in a
// W slot: (2C + F2 + Q) N floats per layer (sequence parallel: all N rows). W reads dY
// from there and X from the activation slot, which therefore stays held until W. The
// kernels make dX and dW in separate calls either way, so B then W is bit-identical to
// the joint backward. With a split backward the grad-ready hook fires from W. Full
// recompute is refused: its layers share one recompute block, so X is gone by W time.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "loom/core/bf16.h"
#include "loom/core/config.h"
#include "loom/kernels/kernels.h"
#include "loom/model/layout.h"
#include "loom/model/tp_comm.h"

namespace loom {


// How this rank's model is cut and run (all optional for a whole single-process model).
// Note [Context-parallel attention] (kernels/ops.inc): this rank's rows of every sequence and
// how to meet the other ranks'. size 1: the model computes whole sequences.
struct ContextParallel {
  int size = 1, rank = 0;
  int64_t seq = 0;                             // the whole sequence (the model's max_seq is this rank's rows)
  std::vector<std::vector<int32_t>> positions;  // per cp rank: its positions, ascending (rank/cp_chunks.h)
  TpComm* comm = nullptr;                      // all-gather / reduce-scatter / all-to-all of equal blocks over the cp group
  CpMode mode = CpMode::kAllGather;            // allgather (context_parallel.cc), ulysses or ring (their files)
  // Every cp rank's positions of a shorter whole sequence (a bucketed micro-batch's length).
  std::function<std::vector<std::vector<int32_t>>(int64_t seq)> positions_at;
};

struct ModelOptions {
  LayoutPadding padding;            // data-parallel bucket padding
  ContextParallel cp;               // Note [Context-parallel attention]
  ModelPart part;                   // pipeline chunks, tensor-parallel slice
  int act_slots = 1;                // micro-batches whose activations a chunk holds at once
  TpComm* tp_comm = nullptr;        // required when part.tp > 1
  // Required when part.pp_vocab(): the all-reduces over the vocabulary group (the pipeline's
  // ranks x tp, in part.vocab_index() order; Note [Vocabulary passes] in parallel/schedule.h).
  TpComm* vocab_comm = nullptr;
  std::vector<Recompute> recompute; // per layer; empty: none
  bool sp = false;                  // sequence parallel (needs part.tp > 1; Note [Sequence parallel])
  Precision precision = Precision::kFp32;  // kBf16: bf16 GEMM inputs (Note [bf16 rounding points])
  // kBf16: keep the saved GEMM inputs in bf16 (Note [bf16 activation storage]); false keeps
  // them in fp32 with the same results (tests check that the storage changes nothing).
  bool bf16_activations = true;
  int w_slots = 0;  // per chunk: W slots of a split backward (Note [B/W split]); 0: backward is one step
  // Note [Parameter offload]: the parameters live elsewhere; the flat buffer's pages are
  // handed back as soon as it is allocated (before the gradients are), so a model larger
  // than memory can be built.
  bool params_elsewhere = false;
  bool grads_elsewhere = false;  // Note [Gradient chunks]: the same for the gradient buffer
  // Note [Huge pages] (core/memory.h): the flat parameter / gradient buffer on 2 MiB pages.
  // Only where no page of it is handed back (ZeRO-3 releases the parameters a rank does not
  // own, ZeRO-2 the gradients): a write there would fault a whole huge page back in.
  bool huge_params = true, huge_grads = true;
};

class Model {
 public:
  // Allocates parameters, gradients and activations for micro-batches up to
  // (max_batch, max_seq). Parameters start at zero; call init_weights or load them.
  // opt.part: the pieces this rank holds (Note [Model parts]); opt.act_slots: micro-batches
  // whose activations each chunk can hold at once (a pipeline schedule's peak in flight).
  Model(const ModelConfig& cfg, int64_t max_batch, int64_t max_seq, KernelBackend backend = KernelBackend::kCpu,
        const ModelOptions& opt = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const Kernels& ops() const { return k_; }
  // The layers point into these buffers: copy new values in, never reassign or resize.
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  // Exchanges the parameter buffer with `other` (laid out as params(), its size) and points
  // every parameter view at the new one: O(1), no copy (Note [2BW's update in the waits]). No
  // unit may be bound elsewhere (bind_unit_params) while it runs.
  void swap_params(std::vector<float>& other);
  // Reading the gradients settles them first (Note [Fresh gradients]).
  std::vector<float>& grads() {
    settle_fresh(0, int(cfg_.layers));
    return grads_;
  }
  const std::vector<float>& grads() const {  // logically const: the values zero_grads promised
    const_cast<Model*>(this)->settle_fresh(0, int(cfg_.layers));
    return grads_;
  }
  // The gradient buffer unsettled: only for a reader armed before backward that reads a
  // tensor once the grad-ready hook has declared it final (the data-parallel reducer).
  float* grad_buffer() { return grads_.data(); }
  // Bytes held for activations and backward scratch.
  int64_t activation_bytes() const;

  int chunks() const { return int(chunks_.size()); }
  bool chunk_has_embed(int c) const { return part_.embed && c == 0; }
  bool chunk_has_head(int c) const { return part_.head && c + 1 == chunks(); }
  // Whether chunk c looks the embedding up itself (not under pp_vocab, whose passes do).
  bool embeds_here(int c) const { return chunk_has_embed(c) && !part_.pp_vocab(); }

  // GPT-2 init: N(0, init_std) for matrices and embeddings, residual output projections
  // scaled by 1/sqrt(2 * layers), biases 0, norm weights 1. Deterministic from the seed,
  // and the same values for a tensor whichever part holds it (the whole model's random
  // stream is walked; tensors not held are skipped).
  // Draws the initial weights into `into` (laid out as params(); nullptr: params()); calls
  // written(offset, count) after each tensor of this part is complete there.
  void init_weights(uint64_t seed, float* into = nullptr,
                    const std::function<void(int64_t offset, int64_t count)>& written = {});
  // Note [Fresh gradients]
  // zero_grads memsets every gradient but the four linears' weights and biases of each held
  // block; those it marks fresh, and the first backward to reach a fresh linear writes its
  // gradients (matmul_backward's `fresh`: beta = 0, no read of C) instead of adding them to
  // zeros, and clears the mark. Same bits (0 + x = x); saved: the memset of most of the flat
  // buffer (85 of GPT-2 124M's 124M floats) and the weight-gradient GEMMs' read of C. A fresh
  // range holds stale values until then, so every read settles first (memsets what is still
  // fresh): grads(), and each chunk's backward for its own layers once its weight gradients
  // are done (the joint backward, or the W steps of a split one). Only the reducer reads
  // unsettled (grad_buffer()), and only tensors the grad-ready hook declared final.
  void zero_grads();
  static constexpr int kLinearsPerBlock = 4;

  // One micro-batch, tokens/targets (B,T). Returns the mean loss over B*T tokens and ADDS
  // d(grad_scale * mean loss)/dparams into grads(). A target kIgnoreTarget (padding) adds 0
  // to the sum and still counts in B*T: the caller normalises by its real-token count.
  float forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                         float grad_scale);
  // Called during forward_backward each time the gradients of a suffix of the layout are
  // final for this micro-batch: every tensor with layout index >= first_final has received
  // all its contributions. Values decrease; the last call passes 0. (Data parallelism
  // launches bucket all-reduces from here, overlapping them with the rest of backward.)
  using GradReadyHook = std::function<void(int first_final)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }

  // Pipeline stages. Chunk c of this part on activation slot s (s < act_slots):
  // forward input is `tokens` (B,T) for the embedding chunk, else x_in (B,T,C) from the
  // previous stage. A head chunk needs `targets`, returns the mean loss over B*T and, as the
  // fused LM-head kernel computes both at once, already ADDS d(grad_scale * loss) to the
  // head's gradients; other chunks return 0 and leave their output at stage_output(c, s).
  float stage_forward(int chunk, int slot, const int32_t* tokens, const float* x_in, const int32_t* targets,
                      int64_t B, int64_t T, float grad_scale);
  const float* stage_output(int chunk, int slot) const;
  // Floats of one stage boundary activation: (B,T,C), or its sequence-parallel shard.
  int64_t boundary_floats(int64_t B, int64_t T) const { return rows(B * T) * cfg_.d_model; }
  // dy (B,T,C) = dL/d(stage output) (ignored by head chunks, whose upstream gradient was
  // made in forward). Adds parameter gradients; leaves dL/d(x_in) at stage_input_grad(c, s)
  // unless the chunk starts with the embedding.
  void stage_backward(int chunk, int slot, const float* dy, int64_t B, int64_t T);
  const float* stage_input_grad(int chunk, int slot) const;
  // Note [B/W split]: stage_backward less the linear layers' weight gradients, whose
  // upstream gradients go to W slot `w` (< w_slots) of the chunk; then, any time before
  // `slot` is reused, stage_backward_weight adds them.
  void stage_backward_input(int chunk, int slot, int w, const float* dy, int64_t B, int64_t T);
  void stage_backward_weight(int chunk, int slot, int w, int64_t B, int64_t T);

  // ZeRO-3 (Note [ZeRO-3] in parallel/zero.h): hook(unit, true) before the model reads a
  // unit's weights, hook(unit, false) after. Units: block l = l, embedding = layers,
  // final norm + head = layers + 1 (GPT's tied head also reads the embedding unit).
  using ParamHook = std::function<void(int unit, bool acquire)>;
  void set_param_hook(ParamHook hook) { param_hook_ = std::move(hook); }
  // Gradient chunks (Note [Gradient chunks] in modes/offload/chunk_manager.h): hook(unit, true)
  // before the model writes a unit's gradients, hook(unit, false) after.
  void set_grad_hook(ParamHook hook) { grad_hook_ = std::move(hook); }
  // Points the parameter views of `unit` at `base`: the unit's values laid out as in the
  // flat buffer, from the unit's first tensor on (a gathered copy elsewhere); nullptr points
  // them back at params().
  void bind_unit_params(int unit, float* base);
  // Every unit that ends within the leading `end` floats of the flat layout bound to `base` laid
  // out as params() (base + the unit's offset); nullptr points them back at params(). A weight
  // version kept beside the parameters (2bw's stash, pipedream's, 2bw's aside vocabulary copy).
  void bind_params(float* base, int64_t end = std::numeric_limits<int64_t>::max());
  // The flat range from a unit's first tensor to the end of its last ({0, 0}: not in this part).
  FlatRange unit_range(int unit) const {
    return unit_offset_[size_t(unit)] < 0 ? FlatRange{0, 0}
                                          : FlatRange{unit_offset_[size_t(unit)], unit_end_[size_t(unit)] - unit_offset_[size_t(unit)]};
  }
  int units() const { return int(unit_offset_.size()); }
  // GPT's tied embedding under data parallelism (Note [Tied embedding reduction] in
  // parallel/grad_sync.h): head_done() runs once the head's gradient for this micro-batch
  // is in wte's gradient; embedding(tokens, dout, N) may take over the embedding's wte
  // gradient (returns true; the model then adds only wpe's).
  struct TiedEmbeddingHooks {
    std::function<void()> head_done;
    std::function<bool(const int32_t* tokens, const float* dout, int64_t N)> embedding;
  };
  void set_tied_embedding_hooks(TiedEmbeddingHooks hooks) { tied_hooks_ = std::move(hooks); }
  // Traces: hook(what, layer, true) when a kernel group starts ("forward"/"backward" of
  // block `layer`, "embedding", "head"; layer -1 for the last two), (.., false) when it ends.
  using SpanHook = std::function<void(const char* what, int layer, bool begin)>;
  void set_span_hook(SpanHook hook) { span_hook_ = std::move(hook); }
  // Note [Document-causal mask]: with an end-of-document token set, each position attends
  // only to positions of its own document inside the window: the one after an
  // end-of-document token starts a new document (Megatron's reset_attention_mask). Every
  // forward (train, validation) computes the starts from its tokens; -1 turns it off.
  void set_document_mask(int32_t end_of_document);
  // The activation storage (one allocation), for memory reports.
  const void* activation_storage() const;
  // pp_vocab's (B,T,C) pass buffers, the head's broadcast input and its gradient (empty
  // without pp_vocab): (start, bytes) each, for memory reports.
  std::vector<std::pair<const void*, int64_t>> pass_buffers() const;
  // Note [Vocabulary passes in a stream] (parallel/schedule.h): the leading run of the flat
  // layout the vocabulary passes add gradients to (wte, Llama's head.w, the first stage's wpe);
  // empty without pp_vocab.
  FlatRange vocab_range() const;

  // Note [Vocabulary passes] (parallel/schedule.h), under part.pp_vocab(): the embedding
  // chunk takes its input as x_in (the lookup below) and leaves dL/d(input) at
  // stage_input_grad; the head chunk's forward stops at the final norm and its backward
  // reads the gradient vocab_head left. Each call below is collective over the vocabulary
  // group: every rank makes the same calls in the same order.
  // out (B,T,C) = wte[tokens] (+ wpe) on every rank, each rank looking up its rows.
  void vocab_lookup(float* out, const int32_t* tokens, int64_t B, int64_t T);
  // The head and loss of the micro-batch in the last stage's activation slot `slot` (read
  // there only): its final-norm output broadcast, each rank's logits rows, the softmax's
  // max and sums all-reduced. Returns the mean loss on every rank. backward: also ADDS
  // d(grad_scale * loss) to each rank's head rows and leaves dL/d(norm output) in the slot.
  float vocab_head(int slot, const int32_t* targets, int64_t B, int64_t T, float grad_scale, bool backward);
  // dout (B,T,C), or its rows under sequence parallel: dL/d(embedding output), read on the
  // first stage only: gathered, broadcast, and each rank ADDS its rows' gradient (the first
  // stage wpe's).
  void vocab_embed_grad(const float* dout, const int32_t* tokens, int64_t B, int64_t T);
  // Returns once every rank of the vocabulary group has called it (a one-float all-reduce):
  // a traced pass's span starts there, as a step's starts once its input is here.
  void vocab_meet() const {
    float x = 0;
    vocab_comm_->all_reduce_sum(&x, 1);
  }
  // After the step's last vocabulary pass: the vocabulary tensors' gradients are final.
  void vocab_grads_final() {
    if (grad_ready_) grad_ready_(0);
  }

  // Mean loss only.
  float forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // Full logits (B,T,V) for tests; allocates B*T*V floats in `logits`.
  void forward_logits(const int32_t* tokens, int64_t B, int64_t T, std::vector<float>& logits);
  // Logits (V) of the last position of one sequence of length T (sampling).
  void forward_last_logits(const int32_t* tokens, int64_t T, float* logits);

 private:
  struct Acts;
  struct Slot;
  struct WSlot;
  class Carver;  // carves the activation storage (model.cc)
  void carve_scratch(Carver& c, int64_t N);
  void check_shape(int64_t B, int64_t T) const;
  const int32_t* doc_starts(const Slot& sl) const;
  void check_whole(const char* what) const;
  Slot& slot(int chunk, int s) const;
  // Input -> blocks -> (head chunk) final norm; the head itself is left to the caller.
  void forward_chunk(Slot& sl, int chunk, const int32_t* tokens, const float* x_in, int64_t B, int64_t T);
  // On entry scratch dres = dL/d(chunk output) (head chunk: built from the saved dnormf).
  // ws: B of a split backward (Note [B/W split]); nullptr: the joint backward.
  void backward_chunk(Slot& sl, int chunk, int64_t B, int64_t T, WSlot* ws = nullptr);
  void weight_chunk(const Slot& sl, const WSlot& ws, int chunk, int64_t B, int64_t T);
  WSlot& wslot(int chunk, int w) const;
  void run_backward(int chunk, int slot, const float* dy, int64_t B, int64_t T, WSlot* ws);
  // recompute: a full recompute before the layer's backward (Note [Recompute]), which stops
  // before the MLP's output projection.
  void forward_block(const Slot& sl, int i, int l, int64_t B, int64_t T, bool recompute);
  // Sequence-parallel helpers (Note [Sequence parallel]); without sp they reduce to the
  // plain tensor-parallel all-reduces.
  int64_t rows(int64_t N) const { return sp_ ? N / part_.tp : N; }  // residual-stream rows here
  int64_t row0(int64_t N) const { return sp_ ? part_.tp_rank * (N / part_.tp) : 0; }
  void norm_forward(float* full_out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                    int64_t N) const;
  // A GEMM input as the model keeps it: fp32 (h null) or bf16 (Note [bf16 activation storage]).
  struct GemmIn {
    const float* f;
    const bf16* h;
  };
  // y: the norm's kept output (N,C); bf16 precision reads it instead of the input x (Note
  // [Norm backward from its output]); {nullptr, nullptr}: always from x.
  void norm_backward(float* dx, float* gw, float* gb, const float* dfull, const float* x, GemmIn y, const float* w,
                     const float* b, const float* mean, const float* rstd, int64_t N) const;
  void row_parallel(float* out, GemmIn inp, const float* w, const float* b, int64_t N, int64_t K,
                    const float* residual) const;
  void keep(const float* f, bf16* h, int64_t n) const;  // h = bf16(f) when h is set
  // bf16 precision: f rounded to bf16 in place, and kept in h when set (Note [bf16
  // activation storage]); other precisions: nothing.
  void round_keep(float* f, bf16* h, int64_t n) const;
  // The fp32 values of a kept activation: f itself, or h widened into f (a staging buffer).
  const float* widen(float* f, const bf16* h, int64_t n) const;
  // Attention of one block at this precision: bf16 rounds and keeps P (probs_h, or probs
  // in fp32 storage; Note [bf16 attention probabilities]); fp32 / fp16 keep probs. Ring
  // attention keeps each row's log-sum-exp in probs instead (keeps_lse()).
  void attend(float* out, float* probs, bf16* probs_h, const float* qkv, int64_t B, int64_t T,
              const int32_t* doc_start) const;
  // out: the attention's output, fp32 or kept in bf16 (ring attention's backward reads it,
  // and the doc starts: it recomputes the probabilities).
  void attend_backward(float* dqkv, const float* dout, GemmIn out, const float* qkv, const float* probs,
                       const bf16* probs_h, int64_t B, int64_t T, const int32_t* doc_start) const;
  // Note [Context-parallel attention] (context_parallel.cc): the cp group's K|V in position
  // order, the rows' attention against it, and backward's dK|dV reduce-scattered to their
  // owners and added into dqkv.
  const float* gather_kv(const float* qkv, int64_t B, int64_t T) const;
  // The K|V columns of `rows` rows of qkv ((H+2KV)hd each) into kv (2 KV hd each), and a
  // dK|dV g of that shape added back into dqkv's K|V columns (all-gather and ring).
  void take_kv_columns(float* kv, const float* qkv, int64_t rows) const;
  void add_kv_columns(float* dqkv, const float* g, int64_t rows) const;
  void attend_cp(float* out, float* probs, bf16* probs_h, const float* qkv, int64_t B, int64_t T,
                 const int32_t* doc_start) const;
  // Note [Document-causal mask] under context parallelism: every row's document start as a
  // global position, from the cp group's tokens put in position order (ulysses: every
  // position's, (B, Tk), as its whole-sequence attention reads them).
  void cp_doc_starts(const int32_t* tokens, int64_t B, int64_t T, std::vector<int32_t>& out) const;
  void attend_cp_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, const bf16* probs_h,
                          int64_t B, int64_t T) const;
  // Note [Ulysses attention] (ulysses.cc): rows to heads and back by all-to-all over the cp
  // group; a HeadRun is `heads` heads of hd columns starting at head column `first` of a row.
  struct HeadRun {
    int64_t first, heads;
  };
  int64_t ulysses_buffers(std::span<const HeadRun> runs, int64_t B, int64_t T, int64_t& width) const;
  void ulysses_to_heads(const float* local, int64_t row, std::span<const HeadRun> runs, int64_t B, int64_t T,
                        float* full) const;
  void ulysses_to_rows(const float* full, int64_t row, std::span<const HeadRun> runs, int64_t B, int64_t T,
                       float* local, bool add) const;
  void attend_ulysses(float* out, float* probs, bf16* probs_h, const float* qkv, int64_t B, int64_t T,
                      const int32_t* doc_start) const;
  void attend_ulysses_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                               const bf16* probs_h, int64_t B, int64_t T) const;
  // Note [Ring attention] (ring_attention.cc): K|V blocks around the cp ring.
  void attend_ring(float* out, float* probs, const float* qkv, int64_t B, int64_t T, const int32_t* doc_start) const;
  void attend_ring_backward(float* dqkv, const float* dout, GemmIn out, const float* qkv, const float* lse,
                            int64_t B, int64_t T, const int32_t* doc_start) const;
  // Ring attention keeps one fp32 log-sum-exp per query row for its backward, not P.
  bool keeps_lse() const { return cp_.size > 1 && cp_.mode == CpMode::kRing; }
  // A micro-batch of T rows a rank: every cp rank's positions of its whole T cp tokens (a
  // bucketed batch is shorter than train.seq; Note [Length bucketing]).
  void use_cp_length(int64_t T);
  // A local row's position in its sequence (Note [Context-parallel chunks]), and all of them
  // (null without context parallelism: row t is position t).
  int64_t position(int64_t t) const { return cp_.size > 1 ? cp_.positions[size_t(cp_.rank)][size_t(t)] : t; }
  const int32_t* cp_positions() const { return cp_.size > 1 ? cp_.positions[size_t(cp_.rank)].data() : nullptr; }
  // Floats kept per query row for attention's backward: P over the keys it may see (the
  // whole sequence under context parallelism, else the rows), or ring attention's one
  // log-sum-exp; as activation_floats's key_seq.
  int64_t key_len(int64_t T) const { return keeps_lse() ? kLseOnly : cp_.size > 1 ? cp_.seq : T; }
  void add_positions(float* x, int64_t B, int64_t T) const;     // x (B,T,C) += wpe at the rows' positions
  void add_position_grads(const float* d, int64_t B, int64_t T);  // dwpe at the rows' positions += d (B,T,C)
  void mm_forward(float* out, GemmIn in, const float* w, const float* b, int64_t N, int64_t IC, int64_t OC) const;
  void mm_backward(float* dinp, float* dw, float* db, const float* dout, GemmIn in, const float* w, int64_t N,
                   int64_t IC, int64_t OC, bool fresh) const;
  // Note [Fresh gradients]: linear j (kLinears order in fresh_grads.cc) of block l.
  void index_fresh();
  bool take_fresh(int l, int j);
  void settle_fresh(int first_layer, int end_layer);
  const float* gather_grad(const float* d, int64_t N) const;
  void reduce_input_grad(float* dfull, int64_t N) const;
  void tp_sum(float* x, int64_t n) const {
    if (tp_comm_) tp_comm_->all_reduce_sum(x, n);
  }
  void embed_forward(float* out, const int32_t* tokens, int64_t B, int64_t T) const;
  // Note [Vocabulary passes]: x summed over the vocabulary group, onto group rank root
  // (pp_vocab without tp in the group) or onto every rank; the last stage's speaker's rank.
  void vocab_sum(float* x, int64_t n, int root) const;
  int last_stage_root() const { return part_.vocab_head_pp_rank * (part_.vocab_parts() / part_.vocab_pp); }
  void embed_backward(const float* dout, const int32_t* tokens, int64_t B, int64_t T);
  // Mean loss over N rows of head(x); with dx, also dx += d(scale * loss)/dx and head grads.
  float head_loss(const float* x, const int32_t* targets, int64_t N, float* dx, float grad_scale);
  float* acts_losses() const;  // (N) per-row losses scratch
  float* full_tmp() const;     // (N,C) sequence-parallel scratch
  void view_params();  // pv_ over params_
  void index_units();
  void carve_activations(const ModelPart& part, int act_slots);
  void span(const char* what, int layer, bool begin) const {
    if (span_hook_) span_hook_(what, layer, begin);
  }
  void use(int unit, bool acquire) const {
    if (param_hook_) param_hook_(unit, acquire);
  }
  void writes(int unit, bool begin) const {
    if (grad_hook_) grad_hook_(unit, begin);
  }
  int embed_unit() const { return int(cfg_.layers); }
  int head_unit() const { return int(cfg_.layers) + 1; }
  struct WBlock;
  void backward_block(const Slot& sl, int i, int l, int64_t B, int64_t T, WBlock* wb);
  void weight_block(const Slot& sl, const WBlock& wb, int i, int l, int64_t B, int64_t T);

  ModelConfig cfg_;
  ModelPart part_;
  std::vector<std::pair<int, int>> chunks_;
  int act_slots_ = 1;
  int w_slots_ = 0;
  TpComm* tp_comm_ = nullptr;
  TpComm* vocab_comm_ = nullptr;  // the vocabulary parts' group: tp_comm_, or pp_vocab's
  mutable std::vector<float> vocab_x_, vocab_dx_;  // pp_vocab: (N,C) a pass's broadcast input and its gradient
  ContextParallel cp_;
  mutable std::vector<float> cp_blocks_, cp_kv_;  // the gathered K|V: rank-major blocks, then in position order
  mutable std::vector<float> cp_dkv_;             // backward: dL/dK|V of every position (B, Tk, 2 KV hd)
  mutable std::vector<float> cp_heads_, cp_out_;  // ulysses: qkv and out (or dout) of this rank's heads, all rows
  mutable std::vector<float> cp_ml_;              // ring: per query row (m, l), then backward's D
  std::vector<Recompute> recompute_;  // per layer
  bool sp_ = false;
  int64_t Hl_ = 0, KVl_ = 0, Fl_ = 0, Vl_ = 0;  // this rank's heads, kv heads, ffn width, vocab rows
  ParamLayout layout_;
  const Kernels& k_;
  bool bf16_ = false;       // train.precision = bf16 (its rounding points)
  bool bf16_acts_ = false;  // Note [bf16 activation storage]
  int64_t max_batch_, max_seq_;
  std::vector<float> params_, grads_;
  ModelView pv_, gv_;
  std::unique_ptr<Acts> acts_;
  int32_t doc_mask_token_ = -1;  // Note [Document-causal mask]; -1: plain causal
  GradReadyHook grad_ready_;
  ParamHook param_hook_, grad_hook_;
  // Per unit: (view field, offset from the unit's first tensor) of every tensor it holds.
  std::vector<std::vector<std::pair<float**, int64_t>>> unit_fields_;
  std::vector<int64_t> unit_offset_, unit_end_;
  TiedEmbeddingHooks tied_hooks_;
  SpanHook span_hook_;
  std::vector<int> block_first_tensor_;  // layout index of each block's first tensor
  struct FreshLinear {
    FlatRange w, b;  // count 0: not held / no bias
  };
  std::vector<FreshLinear> fresh_linears_;  // layers x kLinearsPerBlock
  std::vector<uint8_t> fresh_;              // per fresh_linears_ entry
  bool fresh_any_ = false;
  std::vector<FlatRange> zero_pieces_;  // what zero_grads memsets
  int normf_tensor_ = 0;                 // layout index of normf.w
};

}  // namespace loom
