// The parameter layout table. Parameters, gradients and AdamW moments each live in one
// flat float buffer with this layout; every tensor is an (offset, numel) view.
// Note [flat state]: tensors are stored layer-major (embeddings, block 0..L-1, final norm,
// head; under pp_vocab the vocabulary rows, wte and Llama's head, lead) and each offset is aligned to kAlignFloats so views are SIMD-aligned and a ZeRO
// shard or DDP bucket can be cut at tensor boundaries. Padding floats are always zero.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/config.h"

namespace loom {

// A contiguous run of a flat buffer, in floats: a ZeRO shard piece or a bucket.
struct FlatRange {
  int64_t offset = 0, count = 0;
};

// `ranges` minus [hole.offset, hole.offset + hole.count).
std::vector<FlatRange> subtract(const std::vector<FlatRange>& ranges, FlatRange hole);
// The parts of `ranges` inside `window`.
std::vector<FlatRange> intersect(const std::vector<FlatRange>& ranges, FlatRange window);

struct ParamSpec {
  std::string name;            // loom name, e.g. "h.3.attn.qkv.w"
  std::vector<int64_t> shape;  // this rank's shape, row-major; linear weights are (out, in)
  int64_t offset = 0;          // in floats, into the flat buffer
  int64_t numel = 0;
  bool decay = false;          // weight decay applies (matrices, not norms/biases)
  int layer = -1;              // block index; -1 for embeddings / final norm / head
  // Tensor-parallel placement (design invariant 4): replicated when split_dim < 0, else
  // Split(split_dim) where the global dim is the concatenation of `segments` (qkv rows:
  // [H*hd, KV*hd, KV*hd]; Llama gate|up rows: [F, F]), each divided evenly over tp; this
  // rank holds its slice of every segment, in order. Vocabulary rows are padded to a
  // multiple of tp: global rows at or past `global_rows` are padding (zero, masked out).
  int split_dim = -1;
  std::vector<int64_t> segments;
  int64_t global_rows = 0;     // rows of the whole tensor (dim 0), padding excluded
  // Vocabulary rows (wte, Llama's head.w) split over more ranks than tp (Note [Vocabulary
  // passes] in parallel/schedule.h: over pp x tp): the parts and this rank's part, which
  // replace (tp, tp_rank) wherever the tensor is sliced; 0: split over tp like the rest.
  int vocab_parts = 0, vocab_index = 0;
};

// Extra padding so that groups of consecutive tensors each span a multiple of `multiple`
// floats (Note [Sharded buckets] in parallel/grad_sync.h: a data-parallel bucket that is
// reduce-scattered must split evenly over the dp ranks). Tensors [0, segment_last[0]] form
// the first group, (segment_last[0], segment_last[1]] the next, ...; the last entry must be
// the last tensor. Empty: no extra padding.
struct LayoutPadding {
  std::vector<int> segment_last;
  int64_t multiple = 0;  // a multiple of kAlignFloats
};

// Note [Model parts]
// The pieces of the model one pipeline rank holds: one or more chunks, each a contiguous
// range of global layers (interleaved schedules give a rank several), plus the embedding
// (the rank running virtual stage 0) and the final norm and head (the last virtual
// stage). Tensors keep their global names ("h.5.attn.qkv.w"). GPT ties the head to wte,
// so a head part without the embedding holds its own copy of wte: both copies start
// equal (same init), their gradients are summed across the two ranks and their updates
// are then identical (Megatron's embedding group does the same). Under pp_vocab every rank
// holds its rows of the one table instead (no copy).
struct ModelPart {
  std::vector<std::pair<int, int>> chunks;  // [begin, end) per chunk; empty: all layers, one chunk
  bool embed = true;
  bool head = true;
  int tp = 1, tp_rank = 0;  // tensor parallel: this rank's slice (Note [Tensor parallel] in model.h)
  // Under tp: the embedding and head split by vocabulary rows (Megatron's vocab-parallel
  // layers), or (false) whole on every tp rank, trading memory and head compute for the
  // vocabulary collectives (parallel.vocab_parallel).
  bool vocab_parallel = true;
  // Note [Vocabulary passes] (parallel/schedule.h), parallel.pp_vocab: the vocabulary rows
  // split over the pipeline's vocab_pp ranks as well (this rank is vocab_pp_rank of them):
  // every pipeline rank holds its rows of wte (and Llama's head.w) and runs its share of the
  // lookups, the head and the loss in the vocabulary passes; the first stage keeps wpe, the
  // last the final norm. 1: off.
  int vocab_pp = 1, vocab_pp_rank = 0;
  int vocab_head_pp_rank = 0;  // the pipeline rank holding the head (pp - 1; 0 under ZB-V)
  bool pp_vocab() const { return vocab_pp > 1; }
  // The ranks the vocabulary rows split over and this rank's part: pp_vocab's pipeline ranks
  // times tp's (when split over tp), pipeline-major.
  int vocab_parts() const { return vocab_pp * (tp > 1 && vocab_parallel ? tp : 1); }
  int vocab_index() const { return vocab_pp_rank * (vocab_parts() / vocab_pp) + (tp > 1 && vocab_parallel ? tp_rank : 0); }
  bool vocab_split() const { return vocab_parts() > 1; }
  // Whether this rank speaks for its tp group's copy of what the vocabulary group sums: tp
  // rank 0 where the group spans tp, every rank where each tp rank has its own group.
  bool vocab_speaker() const { return tp_rank == 0 || vocab_parts() == vocab_pp; }
  // Vocabulary rows per part: ceil(vocab / parts) when split, else all of them.
  int64_t vocab_shard(const ModelConfig& m) const {
    const int64_t p = vocab_parts();
    return (m.vocab + p - 1) / p;
  }
  // Chunks with an empty list resolved against the model.
  std::vector<std::pair<int, int>> resolved_chunks(const ModelConfig& m) const {
    return chunks.empty() ? std::vector<std::pair<int, int>>{{0, int(m.layers)}} : chunks;
  }
  // GPT's tied wte on a last stage that does not embed: a copy of the first stage's tensor
  // (Note [Tied embedding reduction]).
  // (Under pp_vocab every rank's rows serve both: no copy.)
  bool holds_tied_copy(const ModelConfig& m) const { return m.arch == Arch::kGpt && head && !embed && !pp_vocab(); }
  bool holds_layer(int l) const {
    if (chunks.empty()) return true;
    for (auto [b, e] : chunks)
      if (l >= b && l < e) return true;
    return false;
  }
};

// Floats the model carves for its activations (Note [Recompute] in model.cc): per slot the
// chunk input, each layer's saved tensors (a full-recompute layer only its output; a
// selective one shares one probability buffer), the embedding's tokens or the boundary
// gradient, the head's norm; plus the shared recompute block and the backward scratch.
// Each piece is rounded up to 16 floats. bf16_activations (train.precision = bf16): the
// saved GEMM inputs, qkv and the MLP pre-activation take half (Note [bf16 activation
// storage] in model.cc), plus two fp32 staging buffers, and the residual stream is kept only
// where keeps_block_output says (Note [Lean residual stream]). w_slots: per chunk, the W slots of
// a split backward (Note [B/W split] in model.h). Model's constructor checks its carve
// against this, and the simulator prices the engine's activation memory with it.
// key_seq: the keys a query row sees when it differs from seq (a context-parallel rank's rows
// meet the whole sequence's keys: Note [Context-parallel attention]); 0: seq; kLseOnly: ring
// attention, which keeps one fp32 log-sum-exp per query row instead of P (Note [Ring
// attention]), in every layer that is not fully recomputed, and no shared P.
inline constexpr int64_t kLseOnly = -1;
// key_seq for a layout training sequences of seq_len tokens over cp ranks in `mode`: kLseOnly
// under ring attention, seq_len under other context parallelism (a rank's rows are seq_len /
// cp), else 0.
int64_t key_seq_of(int64_t cp, CpMode mode, int64_t seq_len);
int64_t activation_floats(const ModelConfig& m, const ModelPart& part, int64_t micro_batch, int64_t seq,
                          int act_slots, const std::vector<Recompute>& recompute, bool sp, bool bf16_activations,
                          int w_slots = 0, int64_t key_seq = 0);

// Whether any of the [begin, end) chunks holds a block (Note [Stage split]: an end stage may hold none).
inline bool holds_blocks(const std::vector<std::pair<int, int>>& chunks) {
  for (auto [b, e] : chunks)
    if (b < e) return true;
  return false;
}

// Note [Lean residual stream] (model.cc): with bf16 activations, whether layer l (of a chunk
// ending before layer chunk_end) keeps its block output: only when something reads it after
// the forward, i.e. l is the chunk's last layer (the chunk's output) or the next layer is
// fully recomputed (its rerun reads its input). Fully recomputed layers keep theirs apart.
inline bool keeps_block_output(const std::vector<Recompute>& recompute, int l, int chunk_end) {
  return l + 1 == chunk_end || (!recompute.empty() && recompute[size_t(l) + 1] == Recompute::kFull);
}
// Whether any layer of these chunks writes its output to the shared buffers (one that is
// not fully recomputed and keeps none); only then are the two buffers carved.
inline bool shares_block_outputs(const std::vector<std::pair<int, int>>& chunks,
                                 const std::vector<Recompute>& recompute) {
  for (auto [first, end] : chunks)
    for (int l = first; l < end; ++l)
      if ((recompute.empty() || recompute[size_t(l)] != Recompute::kFull) && !keeps_block_output(recompute, l, end))
        return true;
  return false;
}

class ParamLayout {
 public:
  static constexpr int64_t kAlignFloats = 16;

  explicit ParamLayout(const ModelConfig& m, const LayoutPadding& padding = {}, const ModelPart& part = {});

  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t total_floats() const { return total_; }  // buffer size including padding
  int64_t param_count() const;                      // real parameters, no padding
  // Throws loom::Error naming the closest names when `name` is unknown.
  const ParamSpec& at(const std::string& name) const;
  const ParamSpec* find(const std::string& name) const;

 private:
  void add(std::string name, std::vector<int64_t> shape, bool decay, int layer, int split_dim = -1,
           std::vector<int64_t> segments = {}, int tp = 1);
  void pad_segments(const LayoutPadding& p);
  std::vector<ParamSpec> specs_;
  int64_t total_ = 0;
};

// Pointers into one flat buffer (params or grads). Tensors this part does not hold and unused entries (e.g. biases in Llama,
// wpe in Llama, head_w in GPT where the head is tied to wte) are nullptr.
struct BlockView {
  float *norm1_w = nullptr, *norm1_b = nullptr;
  float *qkv_w = nullptr, *qkv_b = nullptr;        // ((H+2KV)*hd, C)
  float *attn_proj_w = nullptr, *attn_proj_b = nullptr;  // (C, H*hd)
  float *norm2_w = nullptr, *norm2_b = nullptr;
  float *fc_w = nullptr, *fc_b = nullptr;          // GPT: (F, C); Llama gate|up: (2F, C)
  float *mlp_proj_w = nullptr, *mlp_proj_b = nullptr;  // (C, F)
};

struct ModelView {
  float* wte = nullptr;  // (V, C)
  float* wpe = nullptr;  // (ctx, C), GPT only
  std::vector<BlockView> blocks;
  float *normf_w = nullptr, *normf_b = nullptr;
  float* head_w = nullptr;  // (V, C): == wte for GPT (tied), own tensor for Llama
};

ModelView make_view(const ParamLayout& layout, const ModelConfig& m, float* base);

// The field of `v` that views tensor `name` (nullptr for a name the view has no field for).
float** view_field(ModelView& v, const std::string& name);

}  // namespace loom
