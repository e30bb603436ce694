// The model's backward pass: the joint backward and the split B / W steps (Note [B/W
// split] in model.h), over the activations model.cc carves (acts.h).
#include <cstring>
#include <vector>

#include "loom/core/error.h"
#include "loom/model/acts.h"
#include "loom/model/model.h"

namespace loom {

// On entry a.dres = dL/d(block output); on exit a.dres = dL/d(block input), both (Nr,C).
// wb (Note [B/W split]): leave the linears' weight gradients to weight_block, keeping their
// upstream gradients there.
void Model::backward_block(const Slot& sl, int i, int l, int64_t B, int64_t T, WBlock* wb) {
  span("backward", l, true);
  use(l, true);
  writes(l, true);
  if (recompute_[size_t(l)] == Recompute::kFull) forward_block(sl, i, l, B, T, true);
  const Acts& a = *acts_;
  const Slot::Block& s = sl.blocks[size_t(i)];
  const BlockView& w = pv_.blocks[l];
  const BlockView& g = gv_.blocks[l];
  const float* x0 = i == 0 ? sl.input : sl.blocks[size_t(i) - 1].out;
  const int64_t N = B * T, C = cfg_.d_model, H = Hl_, KV = KVl_, hd = cfg_.head_dim();
  const int64_t Q = (H + 2 * KV) * hd, F = Fl_;
  const bool gpt = cfg_.arch == Arch::kGpt;
  const int64_t F2 = gpt ? F : 2 * F;
  auto zero = [](float* p, int64_t n) { std::memset(p, 0, size_t(n) * sizeof(float)); };
  // The weight-gradient outputs (null under a split) and where each linear's dY lands.
  auto gw = [&](float* p) { return wb ? nullptr : p; };
  auto kept_dy = [&](const float* d, float* to, int64_t n) {
    if (!wb) return d;
    std::memcpy(to, d, size_t(n) * sizeof(float));
    return static_cast<const float*>(to);
  };
  float* dfch = wb ? wb->dfch : a.dfch;
  float* dqkv = wb ? wb->dqkv : a.dqkv;

  // MLP: out = x1 + fcg Wp^T + bp
  const float* dproj = kept_dy(gather_grad(a.dres, N), wb ? wb->dproj : nullptr, N * C);
  // Linears in Note [Fresh gradients]'s order; a split backward leaves their marks to W.
  auto fresh = [&](int j) { return !wb && take_fresh(l, j); };
  mm_backward(a.dfcg, gw(g.mlp_proj_w), gw(g.mlp_proj_b), dproj, {s.fcg, s.fcg_h}, w.mlp_proj_w, N, F, C, fresh(0));
  if (s.fch_h && gpt) {
    k_.gelu_backward_bf16_in(dfch, s.fch_h, a.dfcg, N * F);  // overwrites; bf16 storage: dfch may be a.dfcg itself
  } else {
    zero(dfch, N * F2);
    if (s.fch_h) k_.swiglu_backward_bf16_in(dfch, s.fch_h, a.dfcg, N, F);
    else if (gpt) k_.gelu_backward(dfch, s.fch, a.dfcg, N * F);
    else k_.swiglu_backward(dfch, s.fch, a.dfcg, N, F);
  }
  mm_backward(a.dnorm, gw(g.fc_w), gw(g.fc_b), dfch, {s.norm2, s.norm2_h}, w.fc_w, N, C, F2, fresh(1));
  reduce_input_grad(a.dnorm, N);  // column-parallel: sum the input gradients
  norm_backward(a.dres, g.norm2_w, g.norm2_b, a.dnorm, s.x1, {s.norm2, s.norm2_h}, w.norm2_w, w.norm2_b,
                s.norm2_mean, s.norm2_rstd, N);
  // Attention: x1 = x0 + atty Wo^T + bo
  const float* dattn = kept_dy(gather_grad(a.dres, N), wb ? wb->dattn : nullptr, N * C);
  mm_backward(a.datty, gw(g.attn_proj_w), gw(g.attn_proj_b), dattn, {s.atty, s.atty_h}, w.attn_proj_w, N, H * hd, C,
              fresh(2));
  const float* qkv = widen(s.qkv, s.qkv_h, N * Q);
  // Only P is needed (ring attention kept its log-sum-exp): with bf16 storage s.atty is
  // datty's buffer.
  if (recompute_[size_t(l)] == Recompute::kSelective && !keeps_lse())
    attend(s.atty_h ? dqkv : s.atty, s.probs, s.probs_h, qkv, B, T, doc_starts(sl));
  zero(dqkv, N * Q);
  attend_backward(dqkv, a.datty, {s.atty_h ? nullptr : s.atty, s.atty_h}, qkv, s.probs, s.probs_h, B, T,
                  doc_starts(sl));
  if (!gpt) k_.rope_backward(dqkv, B, T, H, KV, hd, float(cfg_.rope_theta), cp_positions());
  mm_backward(a.dnorm, gw(g.qkv_w), gw(g.qkv_b), dqkv, {s.norm1, s.norm1_h}, w.qkv_w, N, C, Q, fresh(3));
  reduce_input_grad(a.dnorm, N);
  norm_backward(a.dres, g.norm1_w, g.norm1_b, a.dnorm, x0, {s.norm1, s.norm1_h}, w.norm1_w, w.norm1_b,
                s.norm1_mean, s.norm1_rstd, N);
  writes(l, false);
  use(l, false);
  span("backward", l, false);
}

// Note [B/W split]: the weight gradients backward_block left out, from the kept dY and
// the slot's saved GEMM inputs. Reads no weights (ZeRO-3 needs no gather here).
void Model::weight_block(const Slot& sl, const WBlock& wb, int i, int l, int64_t B, int64_t T) {
  span("weight", l, true);
  writes(l, true);
  const Slot::Block& s = sl.blocks[size_t(i)];
  const BlockView& g = gv_.blocks[l];
  const int64_t N = B * T, C = cfg_.d_model, hd = cfg_.head_dim(), Q = (Hl_ + 2 * KVl_) * hd, F = Fl_;
  const int64_t F2 = cfg_.arch == Arch::kGpt ? F : 2 * F;
  mm_backward(nullptr, g.mlp_proj_w, g.mlp_proj_b, wb.dproj, {s.fcg, s.fcg_h}, nullptr, N, F, C, take_fresh(l, 0));
  mm_backward(nullptr, g.fc_w, g.fc_b, wb.dfch, {s.norm2, s.norm2_h}, nullptr, N, C, F2, take_fresh(l, 1));
  mm_backward(nullptr, g.attn_proj_w, g.attn_proj_b, wb.dattn, {s.atty, s.atty_h}, nullptr, N, Hl_ * hd, C,
              take_fresh(l, 2));
  mm_backward(nullptr, g.qkv_w, g.qkv_b, wb.dqkv, {s.norm1, s.norm1_h}, nullptr, N, C, Q, take_fresh(l, 3));
  writes(l, false);
  span("weight", l, false);
}

// dx (Nr,C) += dL/dx of the norm, from dfull (N,C) (its own rows); gw/gb += the norm's
// weight gradients, summed over tp under sequence parallel (each rank saw its rows only).
void Model::norm_backward(float* dx, float* gw, float* gb, const float* dfull, const float* x, GemmIn y,
                          const float* w, const float* b, const float* mean, const float* rstd, int64_t N) const {
  const int64_t C = cfg_.d_model, n = rows(N);
  const float* d = dfull + row0(N) * C;
  float* tw = gw;
  float* tb = gb;
  if (sp_) {
    tw = acts_->norm_grad_tmp, tb = gb ? acts_->norm_grad_tmp + C : nullptr;
    std::memset(tw, 0, size_t(2 * C) * sizeof(float));
  }
  if (bf16_ && (y.f || y.h)) {  // Note [Norm backward from its output]: this rank's rows of y
    std::vector<bf16> rounded;  // fp32 storage (a test configuration): y rounded as a bf16 slot holds it
    const bf16* yo = y.h ? y.h + row0(N) * C : nullptr;
    if (!yo) rounded.resize(size_t(n * C)), k_.to_bf16(rounded.data(), y.f + row0(N) * C, n * C), yo = rounded.data();
    const float eps = float(cfg_.norm_eps);
    if (cfg_.arch == Arch::kGpt) k_.layernorm_backward_from_out(dx, tw, tb, d, yo, w, b, rstd, n, C, eps);
    else k_.rmsnorm_backward_from_out(dx, tw, d, yo, w, rstd, n, C, eps);
  } else if (cfg_.arch == Arch::kGpt) {
    k_.layernorm_backward(dx, tw, tb, d, x, w, mean, rstd, n, C);
  } else {
    k_.rmsnorm_backward(dx, tw, d, x, w, rstd, n, C);
  }
  if (!sp_) return;
  tp_comm_->all_reduce_sum(tw, gb ? 2 * C : C);
  for (int64_t c = 0; c < C; c++) gw[c] += tw[c];
  if (gb)
    for (int64_t c = 0; c < C; c++) gb[c] += tb[c];
}

void Model::backward_chunk(Slot& sl, int chunk, int64_t B, int64_t T, WSlot* ws) {
  use_cp_length(T);
  Acts& a = *acts_;
  // A split backward's weight gradients are final only after its W (weight_chunk fires).
  auto ready = [&](int first_final) {
    if (grad_ready_ && !ws) grad_ready_(first_final);
  };
  const int64_t N = B * T, C = cfg_.d_model;
  if (chunk_has_head(chunk)) {
    // sl.dnormf holds dL/d(normf output); turn it into dL/d(x_L) in a.dres.
    const float* xl = sl.blocks.empty() ? sl.input : sl.blocks.back().out;
    std::memset(a.dres, 0, size_t(rows(N) * C) * sizeof(float));
    use(head_unit(), true);
    writes(head_unit(), true);
    norm_backward(a.dres, gv_.normf_w, gv_.normf_b, sl.dnormf, xl, {nullptr, nullptr}, pv_.normf_w, pv_.normf_b,
                  sl.normf_mean, sl.normf_rstd, N);
    writes(head_unit(), false);
    use(head_unit(), false);
    // Layout order is embeddings, blocks, normf, head: the head (own tensor for Llama) and
    // normf are final here, each block after its backward, the embeddings (and GPT's tied
    // head, which is wte) at the end.
    ready(normf_tensor_);
  }
  const auto [first, last] = chunks_[size_t(chunk)];
  for (int l = last - 1; l >= first; l--) {
    backward_block(sl, l - first, l, B, T, ws ? &ws->blocks[size_t(l - first)] : nullptr);
    ready(block_first_tensor_[l]);
  }
  if (!ws) settle_fresh(first, last);  // Note [Fresh gradients]: none is left; a split backward's W clears them
  if (embeds_here(chunk)) {
    span("embedding backward", -1, true);
    writes(embed_unit(), true);
    if (tied_hooks_.embedding && tied_hooks_.embedding(sl.tokens, a.dres, N)) {
      for (int64_t n = 0; n < N; n++) {  // wpe only: wte's share was taken over
        float* g = gv_.wpe + position(n % T) * C;
        const float* d = a.dres + n * C;
        for (int64_t c = 0; c < C; c++) g[c] += d[c];
      }
    } else {
      embed_backward(a.dres, sl.tokens, B, T);
    }
    writes(embed_unit(), false);
    span("embedding backward", -1, false);
    ready(0);
  } else {
    std::memcpy(sl.dinput, a.dres, size_t(rows(N) * C) * sizeof(float));
  }
}

void Model::run_backward(int chunk, int s, const float* dy, int64_t B, int64_t T, WSlot* ws) {
  Slot& sl = slot(chunk, s);
  check_shape(B, T);
  if (!chunk_has_head(chunk)) {
    LOOM_CHECK(dy != nullptr, "model chunk ", chunk, " backward needs dL/d(output)");
    std::memcpy(acts_->dres, dy, size_t(boundary_floats(B, T)) * sizeof(float));
  }
  backward_chunk(sl, chunk, B, T, ws);
}

void Model::stage_backward(int chunk, int s, const float* dy, int64_t B, int64_t T) {
  run_backward(chunk, s, dy, B, T, nullptr);
}

Model::WSlot& Model::wslot(int chunk, int w) const {
  LOOM_CHECK(chunk >= 0 && chunk < chunks() && w >= 0 && w < w_slots_, "model chunk ", chunk, " W slot ", w,
             " outside this part's ", chunks(), " chunks x ", w_slots_, " W slots (ModelOptions::w_slots)");
  return acts_->wslots[size_t(chunk * w_slots_ + w)];
}

void Model::stage_backward_input(int chunk, int s, int w, const float* dy, int64_t B, int64_t T) {
  run_backward(chunk, s, dy, B, T, &wslot(chunk, w));
}

void Model::stage_backward_weight(int chunk, int s, int w, int64_t B, int64_t T) {
  check_shape(B, T);
  weight_chunk(slot(chunk, s), wslot(chunk, w), chunk, B, T);
}

// Note [B/W split]: W of one chunk, and the grad-ready calls its B held back, in the same
// order (head suffix, each block last to first, then everything).
void Model::weight_chunk(const Slot& sl, const WSlot& ws, int chunk, int64_t B, int64_t T) {
  if (chunk_has_head(chunk) && grad_ready_) grad_ready_(normf_tensor_);
  const auto [first, last] = chunks_[size_t(chunk)];
  for (int l = last - 1; l >= first; l--) {
    weight_block(sl, ws.blocks[size_t(l - first)], l - first, l, B, T);
    if (grad_ready_) grad_ready_(block_first_tensor_[l]);
  }
  settle_fresh(first, last);
  if (embeds_here(chunk) && grad_ready_) grad_ready_(0);
}

}  // namespace loom
