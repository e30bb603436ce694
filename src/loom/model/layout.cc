#include "loom/model/layout.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom {

// `shape` is the whole tensor's; a split tensor gets 1/tp of every segment along split_dim.
void ParamLayout::add(std::string name, std::vector<int64_t> shape, bool decay, int layer, int split_dim,
                      std::vector<int64_t> segments, int tp) {
  ParamSpec s;
  s.name = std::move(name);
  s.global_rows = shape[0];
  if (split_dim >= 0) {
    int64_t local = 0;
    for (int64_t seg : segments) {
      LOOM_CHECK(seg % tp == 0, "tensor ", s.name, ": segment of ", seg, " does not split over tp = ", tp);
      local += seg / tp;
    }
    shape[size_t(split_dim)] = local;
    s.split_dim = split_dim;
    s.segments = std::move(segments);
  }
  s.numel = 1;
  for (int64_t d : shape) s.numel *= d;
  s.shape = std::move(shape);
  s.decay = decay;
  s.layer = layer;
  s.offset = total_;
  total_ += (s.numel + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  specs_.push_back(std::move(s));
}

ParamLayout::ParamLayout(const ModelConfig& m, const LayoutPadding& padding, const ModelPart& part) {
  const int64_t C = m.d_model, F = m.ffn, hd = m.head_dim(), tp = part.tp;
  const int parts = part.vocab_parts();
  const int64_t Vp = part.vocab_shard(m) * parts;  // padded to a multiple of the parts
  const bool gpt = m.arch == Arch::kGpt;
  const int t = int(tp);
  // Column-parallel weights split their output rows, row-parallel ones their input
  // columns; norms, row-parallel biases and wpe are replicated.
  auto vocab_rows = [&](const std::string& name) {
    if (part.vocab_split()) add(name, {Vp, C}, true, -1, 0, {Vp}, parts);
    else add(name, {Vp, C}, true, -1);  // replicated over tp
    specs_.back().global_rows = m.vocab;
    if (part.pp_vocab()) specs_.back().vocab_parts = parts, specs_.back().vocab_index = part.vocab_index();
  };
  // Under pp_vocab the vocabulary tensors come first: their gradients are final only after
  // the step's last vocabulary pass, so no suffix of the layout that a backward declares
  // final (Model::GradReadyHook) may hold them.
  if (part.embed || (gpt && part.head) || part.pp_vocab()) vocab_rows("wte");
  if (!gpt && part.pp_vocab()) vocab_rows("head.w");
  if (gpt && part.embed) add("wpe", {m.ctx, C}, true, -1);
  for (int l = 0; l < int(m.layers); l++) {
    if (!part.holds_layer(l)) continue;
    const std::string p = "h." + std::to_string(l) + ".";
    const std::vector<int64_t> qkv_segs = {m.heads * hd, m.kv_heads * hd, m.kv_heads * hd};
    const int64_t qkv = (m.heads + 2 * m.kv_heads) * hd;
    add(p + "norm1.w", {C}, false, l);
    if (gpt) add(p + "norm1.b", {C}, false, l);
    add(p + "attn.qkv.w", {qkv, C}, true, l, 0, qkv_segs, t);
    if (gpt) add(p + "attn.qkv.b", {qkv}, false, l, 0, qkv_segs, t);
    add(p + "attn.proj.w", {C, m.heads * hd}, true, l, 1, {m.heads * hd}, t);
    if (gpt) add(p + "attn.proj.b", {C}, false, l);
    add(p + "norm2.w", {C}, false, l);
    if (gpt) add(p + "norm2.b", {C}, false, l);
    if (gpt) add(p + "mlp.fc.w", {F, C}, true, l, 0, {F}, t);
    else add(p + "mlp.fc.w", {2 * F, C}, true, l, 0, {F, F}, t);
    if (gpt) add(p + "mlp.fc.b", {F}, false, l, 0, {F}, t);
    add(p + "mlp.proj.w", {C, F}, true, l, 1, {F}, t);
    if (gpt) add(p + "mlp.proj.b", {C}, false, l);
  }
  if (part.head) {
    add("normf.w", {C}, false, -1);
    if (gpt) add("normf.b", {C}, false, -1);
    if (!gpt && !part.pp_vocab()) vocab_rows("head.w");
  }
  if (!padding.segment_last.empty()) pad_segments(padding);
}

void ParamLayout::pad_segments(const LayoutPadding& p) {
  const int n = int(specs_.size());
  LOOM_CHECK(p.multiple > 0 && p.multiple % kAlignFloats == 0, "layout padding multiple ", p.multiple,
             " must be a positive multiple of ", kAlignFloats);
  LOOM_CHECK(p.segment_last.back() == n - 1, "layout padding segments end at tensor ", p.segment_last.back(),
             " but the layout has ", n, " tensors");
  int64_t offset = 0;
  int first = 0;
  for (int last : p.segment_last) {
    LOOM_CHECK(last >= first && last < n, "layout padding segment ends at tensor ", last, " after ", first);
    const int64_t start = offset;
    for (int i = first; i <= last; i++) {
      specs_[i].offset = offset;
      offset += (specs_[i].numel + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    }
    offset = start + (offset - start + p.multiple - 1) / p.multiple * p.multiple;
    first = last + 1;
  }
  total_ = offset;
}

int64_t ParamLayout::param_count() const {
  int64_t n = 0;
  for (const auto& s : specs_) n += s.numel;
  return n;
}

const ParamSpec* ParamLayout::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

const ParamSpec& ParamLayout::at(const std::string& name) const {
  if (const ParamSpec* s = find(name)) return *s;
  throw Error("no parameter named '" + name + "' in this model (first: '" + specs_.front().name +
              "', last: '" + specs_.back().name + "')");
}

ModelView make_view(const ParamLayout& layout, const ModelConfig& m, float* base) {
  auto ptr = [&](const std::string& name) -> float* {
    const ParamSpec* s = layout.find(name);
    return s ? base + s->offset : nullptr;
  };
  ModelView v;
  v.wte = ptr("wte");
  v.wpe = ptr("wpe");
  for (int l = 0; l < int(m.layers); l++) {
    const std::string p = "h." + std::to_string(l) + ".";
    BlockView b;
    b.norm1_w = ptr(p + "norm1.w"), b.norm1_b = ptr(p + "norm1.b");
    b.qkv_w = ptr(p + "attn.qkv.w"), b.qkv_b = ptr(p + "attn.qkv.b");
    b.attn_proj_w = ptr(p + "attn.proj.w"), b.attn_proj_b = ptr(p + "attn.proj.b");
    b.norm2_w = ptr(p + "norm2.w"), b.norm2_b = ptr(p + "norm2.b");
    b.fc_w = ptr(p + "mlp.fc.w"), b.fc_b = ptr(p + "mlp.fc.b");
    b.mlp_proj_w = ptr(p + "mlp.proj.w"), b.mlp_proj_b = ptr(p + "mlp.proj.b");
    v.blocks.push_back(b);
  }
  v.normf_w = ptr("normf.w");
  v.normf_b = ptr("normf.b");
  v.head_w = m.arch == Arch::kGpt ? ptr("normf.w") ? v.wte : nullptr : ptr("head.w");
  return v;
}

float** view_field(ModelView& v, const std::string& name) {
  if (name == "wte") return &v.wte;
  if (name == "wpe") return &v.wpe;
  if (name == "normf.w") return &v.normf_w;
  if (name == "normf.b") return &v.normf_b;
  if (name == "head.w") return &v.head_w;
  if (name.rfind("h.", 0) != 0) return nullptr;
  const size_t dot = name.find('.', 2);
  const size_t l = std::stoul(name.substr(2, dot - 2));
  if (l >= v.blocks.size()) return nullptr;
  BlockView& b = v.blocks[l];
  const std::string rest = name.substr(dot + 1);
  if (rest == "norm1.w") return &b.norm1_w;
  if (rest == "norm1.b") return &b.norm1_b;
  if (rest == "attn.qkv.w") return &b.qkv_w;
  if (rest == "attn.qkv.b") return &b.qkv_b;
  if (rest == "attn.proj.w") return &b.attn_proj_w;
  if (rest == "attn.proj.b") return &b.attn_proj_b;
  if (rest == "norm2.w") return &b.norm2_w;
  if (rest == "norm2.b") return &b.norm2_b;
  if (rest == "mlp.fc.w") return &b.fc_w;
  if (rest == "mlp.fc.b") return &b.fc_b;
  if (rest == "mlp.proj.w") return &b.mlp_proj_w;
  if (rest == "mlp.proj.b") return &b.mlp_proj_b;
  return nullptr;
}

int64_t key_seq_of(int64_t cp, CpMode mode, int64_t seq_len) {
  if (cp <= 1) return 0;
  return mode == CpMode::kRing ? kLseOnly : seq_len;
}

int64_t activation_floats(const ModelConfig& m, const ModelPart& part, int64_t micro_batch, int64_t seq,
                          int act_slots, const std::vector<Recompute>& recompute, bool sp, bool bf16_activations,
                          int w_slots, int64_t key_seq) {
  const int64_t tp = part.tp, N = micro_batch * seq, C = m.d_model, hd = m.head_dim();
  const int64_t Hl = m.heads / tp, KVl = m.kv_heads / tp, F = m.ffn / tp;
  const int64_t Q = (Hl + 2 * KVl) * hd, HD = Hl * hd, F2 = m.arch == Arch::kGpt ? F : 2 * F;
  const bool lse = key_seq == kLseOnly;
  const int64_t P = micro_batch * Hl * seq * (lse ? 1 : key_seq > 0 ? key_seq : seq);
  const bool split = sp && tp > 1;
  const int64_t Nr = split ? N / tp : N;
  auto take = [](int64_t n) { return (n + 15) / 16 * 16; };
  auto kept = [&](int64_t n) { return bf16_activations ? take((n + 1) / 2) : take(n); };
  // One saved block: norm1 (+mean, rstd), qkv, probs, attention output, x1, norm2 (+mean,
  // rstd), MLP hidden (F2), its activation (F), block output.
  // Note [Lean residual stream]: with bf16 activations x1 lives in a shared buffer and the
  // block output only where keeps_block_output says.
  const int64_t probs = lse ? take(P) : kept(P);
  auto block = [&](bool with_probs, bool keep_out) {
    const int64_t residual = bf16_activations ? (keep_out ? take(Nr * C) : 0) : 2 * take(Nr * C);
    return kept(N * C) + 2 * take(Nr) + kept(N * Q) + (with_probs || lse ? probs : 0) + kept(N * HD) + kept(N * C) +
           2 * take(Nr) + kept(N * F2) + kept(N * F) + residual;
  };
  const auto chunks = part.resolved_chunks(m);
  // A part of no block (a stage that only embeds or only runs the head: Note [Stage split])
  // carves none of the blocks' shared buffers and scratch.
  const bool blocks = holds_blocks(chunks);
  const bool any_full = blocks && std::count(recompute.begin(), recompute.end(), Recompute::kFull) > 0;
  const bool any_selective = blocks && std::count(recompute.begin(), recompute.end(), Recompute::kSelective) > 0;
  int64_t total = (any_full ? block(true, false) : 0) + (any_selective && !lse ? probs : 0);
  if (bf16_activations && blocks)  // staging buffers; the shared x1 and, where used, the two block outputs
    total += take(N * (m.arch == Arch::kGpt ? std::max(C, HD) : std::max({C, HD, F}))) + take(N * std::max(Q, F2)) +
             take(Nr * C) +
             (shares_block_outputs(chunks, recompute) ? 2 * take(Nr * C) : 0);
  for (size_t c = 0; c < chunks.size(); ++c) {
    int64_t slot = take(Nr * C);  // input
    for (int l = chunks[c].first; l < chunks[c].second; ++l) {
      const Recompute r = recompute.empty() ? Recompute::kNone : recompute[size_t(l)];
      slot += r == Recompute::kFull ? take(Nr * C)
                                    : block(r == Recompute::kNone, keeps_block_output(recompute, l, chunks[c].second));
    }
    slot += (part.embed && c == 0 && !part.pp_vocab()) ? take(N) : take(Nr * C);  // tokens, or the boundary gradient
    if (part.head && c + 1 == chunks.size()) slot += take(N * C) + 2 * take(Nr) + take(N * C);
    total += slot * act_slots;
    // Note [B/W split]: per W slot and layer, the upstream gradients of the four linears.
    const int64_t wslot = (chunks[c].second - chunks[c].first) * (2 * take(N * C) + take(N * F2) + take(N * Q));
    total += wslot * w_slots;
  }
  total += take(N);                                                            // losses
  // backward scratch; with bf16 storage the norms', attention's and the MLP's input gradients
  // live in the staging buffers (Note [Lean residual stream])
  total += take(N * C);  // dres
  if (blocks) total += take(N * Q) + (bf16_activations ? 0 : take(N * C) + take(N * HD) + take(N * F2) + take(N * F));
  if (split) total += take(N * C) + take(2 * C);
  return total;
}

std::vector<FlatRange> subtract(const std::vector<FlatRange>& ranges, FlatRange hole) {
  std::vector<FlatRange> out;
  const int64_t h0 = hole.offset, h1 = hole.offset + hole.count;
  for (const FlatRange& r : ranges) {
    const int64_t r0 = r.offset, r1 = r.offset + r.count;
    if (r1 <= h0 || r0 >= h1) {
      out.push_back(r);
      continue;
    }
    if (r0 < h0) out.push_back({r0, h0 - r0});
    if (r1 > h1) out.push_back({h1, r1 - h1});
  }
  return out;
}

std::vector<FlatRange> intersect(const std::vector<FlatRange>& ranges, FlatRange window) {
  std::vector<FlatRange> out;
  for (const FlatRange& r : ranges) {
    const int64_t lo = std::max(r.offset, window.offset), hi = std::min(r.offset + r.count, window.offset + window.count);
    if (hi > lo) out.push_back({lo, hi - lo});
  }
  return out;
}

}  // namespace loom
