#include "loom/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "loom/core/error.h"
#include "loom/core/memory.h"
#include "loom/model/acts.h"
#include "loom/model/tp_slice.h"

namespace loom {


// Note [Recompute]
// A layer's saved activations are pointers into the slot's storage. Selective recompute
// points every such layer's `probs` at one shared buffer and reruns the attention core
// before its backward; full recompute keeps only the block output (the next block's
// input) per layer, points everything else at one shared block, and reruns the block
// forward (its tensor-parallel all-reduces included) before its backward, up to the MLP
// activation fcg: the output projection's backward reads fcg and dL/d out, the residual's
// nothing, so the projection, its all-reduce (or reduce-scatter) and the residual add are
// not rerun - their result is the block output, which is kept or already consumed. That is
// the last GEMM of four (a third of a GPT block's GEMM FLOPs at ffn 4h), as PyTorch's
// non-reentrant checkpoint stops early (torch >= 2.1); Megatron's recompute reruns it all.
// The kernels are deterministic, so recomputed values are bit-identical to the originals.

// Note [Lean residual stream]
// In train.precision = bf16 the norms' backward reads their kept bf16 outputs, not their
// inputs (Note [Norm backward from its output] in kernels/ops_bf16.inc), so with bf16
// activations the fp32 residual stream is not kept per layer: x1 (after attention) lives
// in one shared buffer, and a block's output in one of two shared buffers (alternating, so
// a block reads its input from one and writes its output to the other) unless something
// reads it after the forward (keeps_block_output in layout.h: the chunk's output, the input
// of a fully recomputed layer). That saves 2 C fp32 per token and layer, a quarter of a
// GPT block's bf16 activations. The per-rank buffers shrink the same way: nothing in the
// staging buffers outlives a forward or backward step, so a backward step keeps its input
// gradients there too (dL/d norm output and dL/d attention output in `stage`, the MLP's in
// `stage2`: GELU runs in place, forward over fch and backward over dL/d activation, so GPT's
// `stage` is only as wide as a norm; carve_scratch). The tiny default model's activations went
// from 59% to 54% of fp32's with this, GPT-2 small's from 50% to 48%.

// Note [bf16 activation storage]
// In train.precision = bf16 every GEMM reads its inputs rounded to bf16 (Note [bf16
// rounding points]), so the activations saved only to be GEMM inputs (both norm outputs,
// the attention output and the MLP activation: (2C + H*hd + F) N of a block's saved
// values) are kept in bf16: each is produced in fp32 into one shared staging buffer,
// rounded once into its bf16 slot, and read from there by the forward GEMM and by the
// backward weight-gradient GEMM. Two GEMM outputs are rounded too, as autocast stores
// them: qkv (after RoPE) and the MLP pre-activation fch are rounded to bf16 in place
// before anything reads them (attention, GELU / SwiGLU), kept in bf16, and widened into a
// second staging buffer for backward. The softmax probabilities P (B H T^2 per layer), which
// the bf16 attention kernels round (Note [bf16 attention probabilities]), are kept in bf16
// too and read there directly. Results are bit-identical to keeping all of them in fp32
// with the same roundings (ModelOptions::bf16_activations = false); memory changes.

class Model::Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += (n + 15) / 16 * 16;
    return p;
  }
  bf16* take_bf16(int64_t n) { return reinterpret_cast<bf16*>(take((n + 1) / 2)); }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

Model::Model(const ModelConfig& cfg, int64_t max_batch, int64_t max_seq, KernelBackend backend,
             const ModelOptions& opt)
    : cfg_(cfg), part_(opt.part), chunks_(opt.part.resolved_chunks(cfg)), act_slots_(opt.act_slots),
      w_slots_(opt.w_slots),
      tp_comm_(opt.tp_comm), cp_(opt.cp), recompute_(opt.recompute), sp_(opt.sp && opt.part.tp > 1), Hl_(cfg.heads / opt.part.tp),
      KVl_(cfg.kv_heads / opt.part.tp), Fl_(cfg.ffn / opt.part.tp), Vl_(opt.part.vocab_shard(cfg)),
      layout_(cfg, opt.padding, opt.part), k_(kernels(backend, opt.precision)), bf16_(opt.precision == Precision::kBf16),
      bf16_acts_(bf16_ && opt.bf16_activations), max_batch_(max_batch),
      max_seq_(max_seq) {
  const ModelPart& part = opt.part;
  const int act_slots = opt.act_slots;
  if (recompute_.empty()) recompute_.assign(size_t(cfg.layers), Recompute::kNone);
  LOOM_CHECK(int64_t(recompute_.size()) == cfg.layers, "recompute policy for ", recompute_.size(),
             " layers given to a ", cfg.layers, "-layer model");
  LOOM_CHECK(part.tp >= 1 && part.tp_rank >= 0 && part.tp_rank < part.tp, "tensor-parallel rank ", part.tp_rank,
             " of ", part.tp, " is not a valid slice");
  LOOM_CHECK(part.tp == 1 || opt.tp_comm != nullptr, "a tensor-parallel model (tp = ", part.tp, ") needs its tp group");
  LOOM_CHECK(cfg.heads % part.tp == 0 && cfg.kv_heads % part.tp == 0 && cfg.ffn % part.tp == 0, "tp = ", part.tp,
             " must divide heads ", cfg.heads, ", kv_heads ", cfg.kv_heads, " and ffn ", cfg.ffn);
  if (part.tp == 1) tp_comm_ = nullptr;
  vocab_comm_ = part.pp_vocab() ? opt.vocab_comm : tp_comm_;
  LOOM_CHECK(!part.pp_vocab() || (opt.vocab_comm && part.vocab_pp_rank >= 0 &&
                                  part.vocab_pp_rank < part.vocab_pp &&
                                  (!part.head || part.vocab_head_pp_rank == part.vocab_pp_rank)),
             "the vocabulary split over the pipeline (parallel.pp_vocab) needs its group (pipeline rank ",
             part.vocab_pp_rank, " of ", part.vocab_pp, ")");
  if (part.pp_vocab()) {  // made once, at their largest: the memory report tracks them (pass_buffers)
    vocab_x_.resize(size_t(max_batch * max_seq * cfg.d_model));
    vocab_dx_.resize(vocab_x_.size());
  }
  LOOM_CHECK(cp_.size == 1 || (cp_.comm && int(cp_.positions.size()) == cp_.size && cp_.rank >= 0 &&
                               cp_.rank < cp_.size && int64_t(cp_.positions[size_t(cp_.rank)].size()) == max_seq),
             "a context-parallel model (cp = ", cp_.size, ") needs its group and every rank's ", max_seq, " positions");
  LOOM_CHECK(cp_.mode != CpMode::kUlysses || (Hl_ % cp_.size == 0 && KVl_ % cp_.size == 0), "Ulysses attention over ",
             cp_.size, " ranks needs the rank's ", Hl_, " heads and ", KVl_, " kv heads divisible by it");
  LOOM_CHECK(max_batch > 0 && max_seq > 0 && max_seq <= cfg.ctx, "model buffers need 0 < batch (", max_batch,
             ") and 0 < seq (", max_seq, ") <= model.ctx (", cfg.ctx, ")");
  LOOM_CHECK(act_slots >= 1, "activation slots must be >= 1, got ", act_slots);
  LOOM_CHECK(w_slots_ >= 0, "W slots must be >= 0, got ", w_slots_);
  LOOM_CHECK(w_slots_ == 0 || std::count(recompute_.begin(), recompute_.end(), Recompute::kFull) == 0,
             "a split backward (zero-bubble schedules) cannot run fully recomputed layers: their inputs are gone by "
             "the weight-gradient step; use recompute none or selective");
  for (int c = 0; c < chunks(); ++c) {  // Note [Stage split]: a chunk that embeds or runs the head may hold no block
    const auto [b, e] = chunks_[size_t(c)];
    const bool may_be_empty = chunk_has_embed(c) || chunk_has_head(c);
    LOOM_CHECK(0 <= b && (b < e || (b == e && may_be_empty)) && e <= cfg.layers, "model chunk [", b, ", ", e,
               ") is not a layer range of the ", cfg.layers, "-layer model");
  }
  if (opt.huge_params && !opt.params_elsewhere) huge_resize(params_, size_t(layout_.total_floats()));  // zeros
  else params_.assign(layout_.total_floats(), 0.0f);
  if (opt.params_elsewhere) release_pages(params_.data(), int64_t(params_.size() * sizeof(float)));
  if (opt.huge_grads && !opt.grads_elsewhere) huge_resize(grads_, size_t(layout_.total_floats()));
  else grads_.assign(layout_.total_floats(), 0.0f);
  if (opt.grads_elsewhere) release_pages(grads_.data(), int64_t(grads_.size() * sizeof(float)));
  view_params();
  gv_ = make_view(layout_, cfg_, grads_.data());
  if (part.pp_vocab() && cfg.arch == Arch::kGpt) gv_.head_w = gv_.wte;  // every rank's rows are tied
  index_units();
  index_fresh();
  block_first_tensor_.assign(cfg.layers, -1);
  for (int i = 0; i < int(layout_.specs().size()); i++) {
    const ParamSpec& s = layout_.specs()[i];
    if (s.layer >= 0 && block_first_tensor_[s.layer] < 0) block_first_tensor_[s.layer] = i;
    if (s.name == "normf.w") normf_tensor_ = i;
  }

  carve_activations(part, act_slots);
  // Heap pages an earlier buffer touched and freed may back the storage (glibc serves blocks
  // below its adaptive mmap threshold from the heap) and would read as resident: handed back.
  release_pages(acts_->storage.get(), activation_bytes());
}

// Note [Recompute] and Note [bf16 activation storage]: the slots of saved activations,
// measured in a first pass and carved from one allocation in a second.
void Model::carve_activations(const ModelPart& part, int act_slots) {
  const ModelConfig& cfg = cfg_;
  const int64_t max_batch = max_batch_, max_seq = max_seq_, N = max_batch * max_seq, C = cfg.d_model, hd = cfg.head_dim();
  // Local (this tp rank's) widths: heads Hl_, kv heads KVl_, MLP Fl_.
  const int64_t Q = (Hl_ + 2 * KVl_) * hd, HD = Hl_ * hd, F = Fl_, F2 = cfg.arch == Arch::kGpt ? F : 2 * F;
  const int64_t P = max_batch * Hl_ * max_seq * std::max<int64_t>(1, key_len(max_seq)), Nr = rows(N);  // Nr: residual-stream rows (sp: a shard)
  LOOM_CHECK(!sp_ || N % part.tp == 0, "sequence parallel needs micro-batch x seq = ", N,
             " rows divisible by tp = ", part.tp);
  Acts& a = *(acts_ = std::make_unique<Acts>());
  const bool gelu = cfg.arch == Arch::kGpt, blocks = holds_blocks(chunks_);  // Note [Lean residual stream]
  const auto count = [&](Recompute r) { return blocks && std::count(recompute_.begin(), recompute_.end(), r) > 0; };
  const bool any_full = count(Recompute::kFull), shared_p = !keeps_lse() && count(Recompute::kSelective);
  auto take_probs = [&](Carver& c, float*& f, bf16*& h) {  // P, bf16 with bf16 storage; ring's lse fp32
    if (bf16_acts_ && !keeps_lse()) f = nullptr, h = c.take_bf16(P);
    else f = c.take(P), h = nullptr;
  };
  // (The measuring pass carves from a null base, so "shared" cannot be read off the pointer.)
  // keep_out: the block output has its own storage (Note [Lean residual stream]); j picks
  // the shared output buffer otherwise, alternating so a block never overwrites its input.
  auto carve_block = [&](Carver& c, Slot::Block& b, bool share_probs, bool keep_out, size_t j) {
    // Note [bf16 activation storage]: a bf16 slot, the fp32 values made in `stage`.
    auto kept = [&](float*& f, bf16*& h, int64_t n, float* stage) {
      if (bf16_acts_) f = stage, h = c.take_bf16(n);
      else f = c.take(n);
    };
    kept(b.norm1, b.norm1_h, N * C, a.stage);
    b.norm1_mean = c.take(Nr), b.norm1_rstd = c.take(Nr);
    kept(b.qkv, b.qkv_h, N * Q, a.stage2);
    if (share_probs) b.probs = a.shared_probs, b.probs_h = a.shared_probs_h;
    else take_probs(c, b.probs, b.probs_h);
    kept(b.atty, b.atty_h, N * HD, a.stage);
    b.x1 = bf16_acts_ ? a.res_x1 : c.take(Nr * C);
    kept(b.norm2, b.norm2_h, N * C, a.stage);
    b.norm2_mean = c.take(Nr), b.norm2_rstd = c.take(Nr);
    kept(b.fch, b.fch_h, N * F2, a.stage2);
    kept(b.fcg, b.fcg_h, N * F, gelu ? a.stage2 : a.stage);  // GELU runs in place over fch
    b.out = !bf16_acts_ || keep_out ? c.take(Nr * C) : a.res_out[j % 2];
  };
  for (int pass = 0; pass < 2; pass++) {
    Carver c(pass == 0 ? nullptr : a.storage.get());
    if (bf16_acts_ && blocks) {
      a.stage = c.take(N * (gelu ? std::max(C, HD) : std::max({C, HD, F}))), a.stage2 = c.take(N * std::max(Q, F2));
      a.res_x1 = c.take(Nr * C);
      if (shares_block_outputs(chunks_, recompute_)) a.res_out[0] = c.take(Nr * C), a.res_out[1] = c.take(Nr * C);
    }
    if (any_full) carve_block(c, a.recompute_block, false, false, 0);
    if (shared_p) take_probs(c, a.shared_probs, a.shared_probs_h);
    a.slots.assign(chunks_.size() * size_t(act_slots), {});
    for (size_t i = 0; i < a.slots.size(); i++) {
      Slot& sl = a.slots[i];
      const int chunk = int(i) / act_slots;
      sl.input = c.take(Nr * C);
      sl.blocks.assign(size_t(chunks_[chunk].second - chunks_[chunk].first), {});
      for (size_t j = 0; j < sl.blocks.size(); j++) {
        Slot::Block& b = sl.blocks[j];
        const Recompute r = recompute_[size_t(chunks_[chunk].first) + j];
        if (r == Recompute::kFull) {
          b = a.recompute_block;
          b.out = c.take(Nr * C);
          continue;
        }
        const int l = chunks_[chunk].first + int(j);
        carve_block(c, b, shared_p && r == Recompute::kSelective, keeps_block_output(recompute_, l, chunks_[chunk].second), j);
      }
      if (embeds_here(chunk)) sl.tokens = reinterpret_cast<int32_t*>(c.take(N));
      else sl.dinput = c.take(Nr * C);
      if (chunk_has_head(chunk))
        sl.normf = c.take(N * C), sl.normf_mean = c.take(Nr), sl.normf_rstd = c.take(Nr), sl.dnormf = c.take(N * C);
    }
    carve_scratch(c, N);
    if (pass == 0) {
      a.floats = c.used();
      LOOM_ASSERT(a.floats == activation_floats(cfg, part, max_batch, max_seq, act_slots, recompute_, sp_, bf16_acts_,
                                                w_slots_, key_len(max_seq)),
                  "activation_floats() disagrees with the model's carve: ", a.floats);
      a.storage.reset(new float[a.floats]);  // uninitialised: pages are touched on first use
      advise_huge_pages(a.storage.get(), a.floats * int64_t(sizeof(float)));  // Note [Huge pages]
    }
  }
}

// The W slots of a split backward and the backward scratch (Note [B/W split], Note [bf16
// activation storage]), carved after the slots.
void Model::carve_scratch(Carver& c, int64_t N) {
  Acts& a = *acts_;
  const int64_t C = cfg_.d_model, hd = cfg_.head_dim(), Q = (Hl_ + 2 * KVl_) * hd, HD = Hl_ * hd, F = Fl_;
  const int64_t F2 = cfg_.arch == Arch::kGpt ? F : 2 * F;
  a.wslots.assign(chunks_.size() * size_t(w_slots_), {});
  for (size_t i = 0; i < a.wslots.size(); i++) {  // Note [B/W split]
    const auto [first, last] = chunks_[i / size_t(w_slots_)];
    for (WBlock& b : a.wslots[i].blocks = std::vector<WBlock>(size_t(last - first)))
      b.dproj = c.take(N * C), b.dfch = c.take(N * F2), b.dattn = c.take(N * C), b.dqkv = c.take(N * Q);
  }
  a.losses = c.take(N);
  a.dres = c.take(N * C);
  // With bf16 storage the backward reads the kept activations from their bf16 slots (the
  // GEMMs, the norms, the MLP activation's backward), so the staging buffers are free during
  // a backward step (Note [Lean residual stream]): `stage` holds dL/d(norm output) from each
  // column-parallel GEMM to its norm's backward and dL/d(attention output) from the
  // projection's backward to attention's; the MLP's gradients are `stage2` (GPT: GELU's
  // backward overwrites dL/d(activation) with dL/d(fc output) in place) or, for SwiGLU,
  // dL/d(activation) in `stage` and dL/d(fc output) in `stage2` (before attention's backward
  // widens qkv into it).
  if (holds_blocks(chunks_)) {  // a part of no block runs no block backward
    a.dnorm = bf16_acts_ ? a.stage : c.take(N * C);
    a.datty = bf16_acts_ ? a.stage : c.take(N * HD);
    a.dqkv = c.take(N * Q);
    a.dfch = bf16_acts_ ? a.stage2 : c.take(N * F2);
    a.dfcg = !bf16_acts_ ? c.take(N * F) : cfg_.arch == Arch::kGpt ? a.stage2 : a.stage;
  }
  if (sp_) a.full_tmp = c.take(N * C), a.norm_grad_tmp = c.take(2 * C);
}

Model::~Model() = default;

float* Model::acts_losses() const { return acts_->losses; }

// Units (Note [ZeRO-3]): block l = l, the tensors before the first block = layers (the
// embedding), the tensors after the last = layers + 1 (final norm and head).
void Model::index_units() {
  const auto& specs = layout_.specs();
  const int L = int(cfg_.layers), n = int(specs.size());
  unit_fields_.assign(size_t(L + 2), {});
  unit_offset_.assign(size_t(L + 2), -1);
  unit_end_.assign(size_t(L + 2), -1);
  int first_block = n;
  for (int i = 0; i < n && first_block == n; i++)
    if (specs[size_t(i)].layer >= 0) first_block = i;
  for (int i = 0; i < n; i++) {
    const ParamSpec& s = specs[size_t(i)];
    const int u = s.layer >= 0 ? s.layer : i < first_block ? L : L + 1;
    if (unit_offset_[size_t(u)] < 0) unit_offset_[size_t(u)] = s.offset;
    unit_end_[size_t(u)] = std::max(unit_end_[size_t(u)], s.offset + s.numel);
    const int64_t at = s.offset - unit_offset_[size_t(u)];
    if (float** f = view_field(pv_, s.name)) unit_fields_[size_t(u)].push_back({f, at});
    if (s.name == "wte" && cfg_.arch == Arch::kGpt && pv_.head_w == pv_.wte)
      unit_fields_[size_t(u)].push_back({&pv_.head_w, at});  // the tied head reads wte
  }
}

void Model::view_params() {
  ModelView v = make_view(layout_, cfg_, params_.data());
  if (part_.pp_vocab() && cfg_.arch == Arch::kGpt) v.head_w = v.wte;  // every rank's rows are tied
  // unit_fields_ point into pv_, its blocks' storage included: that storage is kept (a moved
  // vector keeps its buffer) and written over.
  std::vector<BlockView> blocks = std::move(pv_.blocks);
  blocks.resize(v.blocks.size());  // the constructor's first view, before unit_fields_ exist
  std::copy(v.blocks.begin(), v.blocks.end(), blocks.begin());
  v.blocks = std::move(blocks);
  pv_ = std::move(v);
}

void Model::swap_params(std::vector<float>& other) {
  LOOM_ASSERT(other.size() == params_.size(), "swap_params: ", other.size(), " floats for a ", params_.size(),
              "-float parameter buffer");
  for (int u = 0; u < units(); u++)  // a unit bound elsewhere would keep pointing there
    for (auto [field, at] : unit_fields_[size_t(u)])
      LOOM_ASSERT(unit_offset_[size_t(u)] < 0 || *field == params_.data() + unit_offset_[size_t(u)] + at,
                  "swap_params with unit ", u, " bound to other weights");
  params_.swap(other);
  view_params();
}

void Model::bind_unit_params(int unit, float* base) {
  LOOM_ASSERT(unit >= 0 && unit < int(unit_fields_.size()) && unit_offset_[size_t(unit)] >= 0);
  float* b = base ? base : params_.data() + unit_offset_[size_t(unit)];
  for (auto [field, at] : unit_fields_[size_t(unit)]) *field = b + at;
}

void Model::bind_params(float* base, int64_t end) {
  for (int u = 0; u < units(); u++) {
    const FlatRange r = unit_range(u);
    if (r.count > 0 && r.offset + r.count <= end) bind_unit_params(u, base ? base + r.offset : nullptr);
  }
}

float* Model::full_tmp() const { return acts_->full_tmp; }
const void* Model::activation_storage() const { return acts_->storage.get(); }

int64_t Model::activation_bytes() const { return acts_->floats * int64_t(sizeof(float)); }

void Model::init_weights(uint64_t seed, float* into, const std::function<void(int64_t, int64_t)>& written) {
  float* const base = into ? into : params_.data();
  std::mt19937_64 rng(seed);
  const float std_proj = float(cfg_.init_std / std::sqrt(2.0 * double(cfg_.layers)));
  const ParamLayout whole(cfg_);
  std::vector<float> discard;
  for (const ParamSpec& s : whole.specs()) {
    const ParamSpec* mine = layout_.find(s.name);
    // A split tensor is drawn whole, then this rank's slice is kept.
    const bool slice = mine && mine->split_dim >= 0 && (part_.tp > 1 || mine->vocab_parts > 0);
    if (!mine || slice) discard.assign(size_t(s.numel), 0.0f);
    float* p = mine && !slice ? base + mine->offset : discard.data();
    const bool is_norm = s.name.find("norm") != std::string::npos;
    if (s.shape.size() == 1) {
      std::fill(p, p + s.numel, is_norm && s.name.back() == 'w' ? 1.0f : 0.0f);
      if (slice) slice_to_local(*mine, s.shape, discard.data(), base + mine->offset, part_.tp, part_.tp_rank);
      if (mine && written) written(mine->offset, mine->numel);
      continue;
    }
    const bool residual_out = s.name.find("attn.proj.w") != std::string::npos ||
                              s.name.find("mlp.proj.w") != std::string::npos;
    std::normal_distribution<float> dist(0.0f, residual_out ? std_proj : float(cfg_.init_std));
    for (int64_t i = 0; i < s.numel; i++) p[i] = dist(rng);
    if (slice) slice_to_local(*mine, s.shape, discard.data(), base + mine->offset, part_.tp, part_.tp_rank);
    if (mine && written) written(mine->offset, mine->numel);
  }
}

void Model::check_shape(int64_t B, int64_t T) const {
  LOOM_CHECK(B > 0 && B <= max_batch_ && T > 0 && T <= max_seq_, "batch shape (", B, ", ", T,
             ") exceeds the buffers this model was built for (", max_batch_, ", ", max_seq_, ")");
}

void Model::set_document_mask(int32_t end_of_document) {
  LOOM_CHECK(end_of_document >= -1 && end_of_document < cfg_.vocab, "end-of-document token ", end_of_document,
             " is outside the vocabulary of ", cfg_.vocab);
  doc_mask_token_ = end_of_document;
  if (end_of_document < 0)
    for (Slot& sl : acts_->slots) sl.doc_start.clear();
}

const int32_t* Model::doc_starts(const Slot& sl) const {
  return sl.doc_start.empty() ? nullptr : sl.doc_start.data();
}

// Layer l (global index) = block i of the slot's chunk.
void Model::forward_block(const Slot& sl, int i, int l, int64_t B, int64_t T, bool recompute) {
  const Slot::Block& s = sl.blocks[size_t(i)];
  const BlockView& w = pv_.blocks[l];
  const float* x0 = i == 0 ? sl.input : sl.blocks[size_t(i) - 1].out;  // (Nr,C)
  const int64_t N = B * T, H = Hl_, KV = KVl_, hd = cfg_.head_dim();
  const int64_t Q = (H + 2 * KV) * hd, F = Fl_;
  const bool gpt = cfg_.arch == Arch::kGpt;
  span("forward", l, true);
  use(l, true);
  const int64_t C = cfg_.d_model;
  norm_forward(s.norm1, s.norm1_mean, s.norm1_rstd, x0, w.norm1_w, w.norm1_b, N);  // (N,C) gathered
  keep(s.norm1, s.norm1_h, N * C);
  mm_forward(s.qkv, {s.norm1, s.norm1_h}, w.qkv_w, w.qkv_b, N, C, Q);  // (N,Q) column-parallel
  if (!gpt) k_.rope_forward(s.qkv, B, T, H, KV, hd, float(cfg_.rope_theta), cp_positions());
  round_keep(s.qkv, s.qkv_h, N * Q);
  attend(s.atty, s.probs, s.probs_h, s.qkv, B, T, doc_starts(sl));  // (N,H*hd)
  keep(s.atty, s.atty_h, N * H * hd);
  row_parallel(s.x1, {s.atty, s.atty_h}, w.attn_proj_w, w.attn_proj_b, N, H * hd, x0);  // x1 = x0 + atty Wo^T + bo
  norm_forward(s.norm2, s.norm2_mean, s.norm2_rstd, s.x1, w.norm2_w, w.norm2_b, N);
  keep(s.norm2, s.norm2_h, N * C);
  if (gpt) {
    mm_forward(s.fch, {s.norm2, s.norm2_h}, w.fc_w, w.fc_b, N, C, F);
    round_keep(s.fch, s.fch_h, N * F);
    k_.gelu_forward(s.fcg, s.fch, N * F);
  } else {
    mm_forward(s.fch, {s.norm2, s.norm2_h}, w.fc_w, nullptr, N, C, 2 * F);  // [gate | up]
    round_keep(s.fch, s.fch_h, N * 2 * F);
    k_.swiglu_forward(s.fcg, s.fch, N, F);
  }
  keep(s.fcg, s.fcg_h, N * F);
  if (!recompute)  // Note [Recompute]: nothing the backward reads comes after fcg
    row_parallel(s.out, {s.fcg, s.fcg_h}, w.mlp_proj_w, w.mlp_proj_b, N, F, s.x1);  // out = x1 + fcg W2^T + b2
  use(l, false);
  span("forward", l, false);
}


// Norm of the own rows of x (Nr,C) into their place in full_out (N,C); under sequence
// parallel the other ranks' rows are then gathered in.
void Model::norm_forward(float* full_out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                         int64_t N) const {
  const int64_t C = cfg_.d_model, n = rows(N);
  float* own = full_out + row0(N) * C;
  if (cfg_.arch == Arch::kGpt) k_.layernorm_forward(own, mean, rstd, x, w, b, n, C, float(cfg_.norm_eps));
  else k_.rmsnorm_forward(own, rstd, x, w, n, C, float(cfg_.norm_eps));
  if (sp_) tp_comm_->all_gather_blocks(full_out, n * C);
}


void check_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what) {
  for (int64_t i = 0; i < n; i++)
    LOOM_CHECK(ids[i] >= 0 && ids[i] < vocab, what, " id ", ids[i], " at position ", i,
               " is outside the vocabulary [0, ", vocab, ")");
}

Model::Slot& Model::slot(int chunk, int s) const {
  LOOM_CHECK(chunk >= 0 && chunk < chunks() && s >= 0 && s < act_slots_, "model chunk ", chunk, " slot ", s,
             " outside this part's ", chunks(), " chunks x ", act_slots_, " activation slots");
  return acts_->slots[size_t(chunk * act_slots_ + s)];
}

void Model::check_whole(const char* what) const {
  LOOM_CHECK(chunks() == 1 && part_.embed && part_.head, what, " needs the whole model, but this part holds ",
             chunks(), " chunk(s)", part_.embed ? "" : " without the embedding", part_.head ? "" : " without the head");
}

void Model::forward_chunk(Slot& sl, int chunk, const int32_t* tokens, const float* x_in, int64_t B, int64_t T) {
  check_shape(B, T);
  use_cp_length(T);
  const int64_t N = B * T, C = cfg_.d_model;
  if (embeds_here(chunk)) {
    LOOM_CHECK(tokens != nullptr, "the embedding chunk needs tokens");
    check_ids(tokens, N, cfg_.vocab, "token");
    std::memcpy(sl.tokens, tokens, size_t(N) * sizeof(int32_t));
    span("embedding", -1, true);
    use(embed_unit(), true);
    embed_forward(sl.input, tokens, B, T);
    use(embed_unit(), false);
    span("embedding", -1, false);
  } else {
    LOOM_CHECK(x_in != nullptr, "model chunk ", chunk, " needs its input activation");
    std::memcpy(sl.input, x_in, size_t(rows(N) * C) * sizeof(float));
  }
  if (doc_mask_token_ >= 0) {  // Note [Document-causal mask]
    LOOM_CHECK(tokens != nullptr, "the document-causal mask needs every chunk's tokens");
    if (cp_.size > 1) cp_doc_starts(tokens, B, T, sl.doc_start);
    else {
      sl.doc_start.resize(size_t(N));
      for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0, start = 0; t < T; t++) {
          sl.doc_start[size_t(b * T + t)] = int32_t(start);
          if (tokens[b * T + t] == doc_mask_token_) start = t + 1;
        }
    }
  }
  const auto [first, last] = chunks_[size_t(chunk)];
  for (int l = first; l < last; l++) forward_block(sl, l - first, l, B, T, false);
  if (!chunk_has_head(chunk)) return;
  const float* xl = sl.blocks.empty() ? sl.input : sl.blocks.back().out;
  use(head_unit(), true);
  norm_forward(sl.normf, sl.normf_mean, sl.normf_rstd, xl, pv_.normf_w, pv_.normf_b, N);
  use(head_unit(), false);
}


float Model::stage_forward(int chunk, int s, const int32_t* tokens, const float* x_in, const int32_t* targets,
                           int64_t B, int64_t T, float grad_scale) {
  Slot& sl = slot(chunk, s);
  forward_chunk(sl, chunk, tokens, x_in, B, T);
  if (!chunk_has_head(chunk) || part_.pp_vocab()) return 0.0f;  // pp_vocab: the head runs in a vocabulary pass
  const int64_t N = B * T, C = cfg_.d_model;
  LOOM_CHECK(targets != nullptr, "the head chunk needs targets");
  std::memset(sl.dnormf, 0, size_t(N * C) * sizeof(float));
  const float loss = head_loss(sl.normf, targets, N, sl.dnormf, grad_scale);
  if (tied_hooks_.head_done) tied_hooks_.head_done();
  return loss;
}

const float* Model::stage_output(int chunk, int s) const {
  const Slot& sl = slot(chunk, s);
  return sl.blocks.empty() ? sl.input : sl.blocks.back().out;
}

const float* Model::stage_input_grad(int chunk, int s) const {
  LOOM_CHECK(!embeds_here(chunk), "the embedding chunk has no input activation gradient");
  return slot(chunk, s).dinput;
}

float Model::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                              float grad_scale) {
  check_whole("forward_backward");
  const float loss = stage_forward(0, 0, tokens, nullptr, targets, B, T, grad_scale);
  stage_backward(0, 0, nullptr, B, T);
  return loss;
}

float Model::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  check_whole("forward_loss");
  Slot& sl = slot(0, 0);
  forward_chunk(sl, 0, tokens, nullptr, B, T);
  return head_loss(sl.normf, targets, B * T, nullptr, 0.0f);
}

void Model::forward_logits(const int32_t* tokens, int64_t B, int64_t T, std::vector<float>& logits) {
  check_whole("forward_logits");
  LOOM_CHECK(part_.tp == 1, "forward_logits needs the whole vocabulary on one rank (tp = 1)");
  Slot& sl = slot(0, 0);
  forward_chunk(sl, 0, tokens, nullptr, B, T);
  const int64_t N = B * T;
  logits.resize(size_t(N * cfg_.vocab));
  k_.matmul_forward(logits.data(), sl.normf, pv_.head_w, nullptr, N, cfg_.d_model, cfg_.vocab);
}

void Model::forward_last_logits(const int32_t* tokens, int64_t T, float* logits) {
  check_whole("forward_last_logits");
  LOOM_CHECK(part_.tp == 1, "forward_last_logits needs the whole vocabulary on one rank (tp = 1)");
  Slot& sl = slot(0, 0);
  forward_chunk(sl, 0, tokens, nullptr, 1, T);
  k_.lm_head_logits_row(logits, sl.normf + (T - 1) * cfg_.d_model, pv_.head_w, cfg_.d_model, cfg_.vocab);
}

}  // namespace loom
