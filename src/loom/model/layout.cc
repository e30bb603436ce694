#include "loom/model/layout.h"

#include "loom/core/error.h"

namespace loom {

void ParamLayout::add(std::string name, std::vector<int64_t> shape, bool decay, int layer) {
  ParamSpec s;
  s.name = std::move(name);
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
  const int64_t C = m.d_model, F = m.ffn, V = m.vocab, hd = m.head_dim();
  const int64_t qkv = (m.heads + 2 * m.kv_heads) * hd;
  const bool gpt = m.arch == Arch::kGpt;
  if (part.embed || (gpt && part.head)) add("wte", {V, C}, true, -1);
  if (gpt && part.embed) add("wpe", {m.ctx, C}, true, -1);
  for (int l = 0; l < int(m.layers); l++) {
    if (!part.holds_layer(l)) continue;
    const std::string p = "h." + std::to_string(l) + ".";
    add(p + "norm1.w", {C}, false, l);
    if (gpt) add(p + "norm1.b", {C}, false, l);
    add(p + "attn.qkv.w", {qkv, C}, true, l);
    if (gpt) add(p + "attn.qkv.b", {qkv}, false, l);
    add(p + "attn.proj.w", {C, m.heads * hd}, true, l);
    if (gpt) add(p + "attn.proj.b", {C}, false, l);
    add(p + "norm2.w", {C}, false, l);
    if (gpt) add(p + "norm2.b", {C}, false, l);
    add(p + "mlp.fc.w", {gpt ? F : 2 * F, C}, true, l);
    if (gpt) add(p + "mlp.fc.b", {F}, false, l);
    add(p + "mlp.proj.w", {C, F}, true, l);
    if (gpt) add(p + "mlp.proj.b", {C}, false, l);
  }
  if (part.head) {
    add("normf.w", {C}, false, -1);
    if (gpt) add("normf.b", {C}, false, -1);
    if (!gpt) add("head.w", {V, C}, true, -1);
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

}  // namespace loom
