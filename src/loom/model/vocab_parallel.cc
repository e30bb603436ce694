// Embedding and LM head + cross-entropy, whole or vocab-parallel (Note [Tensor parallel]).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "loom/core/error.h"
#include "loom/model/acts.h"
#include "loom/model/model.h"

namespace loom {

void Model::embed_forward(float* out, const int32_t* tokens, int64_t B, int64_t T) const {
  const int64_t C = cfg_.d_model, N = B * T;
  if (!part_.vocab_split()) {
    // Whole table here: look every row up; under sequence parallel keep the own rows. A
    // context-parallel rank adds wpe at its rows' positions.
    float* dst = sp_ ? full_tmp() : out;
    k_.embedding_forward(dst, tokens, pv_.wte, cp_.size > 1 ? nullptr : pv_.wpe, B, T, C);
    if (cp_.size > 1 && pv_.wpe) add_positions(dst, B, T);
    if (sp_) std::memcpy(out, full_tmp() + row0(N) * C, size_t(rows(N) * C) * sizeof(float));
    return;
  }
  // out = sum over the vocabulary parts (tp, or pp x tp under pp_vocab) of (own rows of wte
  // looked up, zero elsewhere); tp rank 0 of the rank holding wpe adds it. Sequence
  // parallel: out holds the own rows only, the sum reduce-scattered over tp (pp_vocab: summed
  // whole over its group, then the own rows kept).
  float* full = sp_ ? full_tmp() : out;
  const int64_t lo = part_.vocab_index() * Vl_;
  const bool add_pos = pv_.wpe && part_.vocab_speaker();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    float* o = full + n * C;
    const int64_t tok = tokens[n] - lo;
    if (tok >= 0 && tok < Vl_) std::memcpy(o, pv_.wte + tok * C, size_t(C) * sizeof(float));
    else std::fill(o, o + C, 0.0f);
    if (add_pos) {
      const float* p = pv_.wpe + position(n % T) * C;
      for (int64_t c = 0; c < C; c++) o[c] += p[c];
    }
  }
  if (!sp_ || part_.pp_vocab()) {
    vocab_sum(full, N * C, 0);  // (pp_vocab: onto the first stage)
    if (sp_) std::memcpy(out, full + row0(N) * C, size_t(rows(N) * C) * sizeof(float));
    return;
  }
  const int64_t n = rows(N);
  tp_comm_->reduce_scatter_blocks(full, n * C);
  std::memcpy(out, full + row0(N) * C, size_t(n * C) * sizeof(float));
}

void Model::embed_backward(const float* dout, const int32_t* tokens, int64_t B, int64_t T) {
  const int64_t C = cfg_.d_model, N = B * T;
  if (!part_.vocab_split()) {
    // dout is replicated over tp (gathered under sequence parallel), so every tp rank adds
    // the same gradient to its whole copy: the copies stay equal without a reduction.
    const float* d = sp_ ? gather_grad(dout, N) : dout;
    k_.embedding_backward(gv_.wte, cp_.size > 1 ? nullptr : gv_.wpe, d, tokens, B, T, C);
    if (cp_.size > 1 && gv_.wpe) add_position_grads(d, B, T);
    return;
  }
  // dout is replicated (gathered under sequence parallel; pp_vocab's pass gathered it): every
  // rank adds the rows of its own tokens, and all add wpe's.
  if (!part_.pp_vocab()) dout = gather_grad(dout, N);
  const int64_t lo = part_.vocab_index() * Vl_;
  for (int64_t n = 0; n < N; n++) {
    const float* d = dout + n * C;
    const int64_t tok = tokens[n] - lo;
    if (tok >= 0 && tok < Vl_) {
      float* g = gv_.wte + tok * C;
      for (int64_t c = 0; c < C; c++) g[c] += d[c];
    }
    if (gv_.wpe) {
      float* g = gv_.wpe + position(n % T) * C;
      for (int64_t c = 0; c < C; c++) g[c] += d[c];
    }
  }
}

namespace {

// Rows of (rows, Vl) logits per chunk of the vocab-parallel loss: about 8 Mi floats.
constexpr int64_t kLogitBudgetFloats = int64_t{1} << 23;

}  // namespace

// Note [Vocabulary-parallel softmax]
// Split by vocabulary rows (tp's split, or pp_vocab's over pp x tp), rank k holds logits
// z_v for its rows only. Per token row: m = max over the group of the ranks' maxima
// (all-reduced), each rank's S_k = sum of exp(z_v - m) over its rows and its target logit
// (the owner's, 0 elsewhere) summed over the group; loss = log S + m - z_target, and dz_v =
// scale (exp(z_v - m) / S - [v = target]). softmax_exp_rows exponentiates in place between
// the two all-reduces (the kernels' vectorised exponential; the reference's in double), so
// the backward reuses e_v without a second exponential.
float Model::head_loss(const float* x, const int32_t* targets, int64_t N, float* dx, float grad_scale) {
  const int64_t C = cfg_.d_model, V = cfg_.vocab;
  for (int64_t i = 0; i < N; i++)
    LOOM_CHECK(targets[i] == kIgnoreTarget || (targets[i] >= 0 && targets[i] < V), "target id ", targets[i],
               " at position ", i, " is outside the vocabulary [0, ", V, ")");
  float* losses = acts_losses();
  // The units holding the head's weights (Note [ZeRO-3]): its own; GPT's tied head also the
  // embedding's (wte); under pp_vocab only the embedding's, where every rank's vocabulary
  // rows lead the layout (layout.cc).
  const bool tied = cfg_.arch == Arch::kGpt, own = !part_.pp_vocab(), embed = tied || !own;
  span("head", -1, true);
  if (own) use(head_unit(), true);
  if (embed) use(embed_unit(), true);
  if (dx && own) writes(head_unit(), true);  // the head's gradients (GPT's tied head: wte's)
  if (dx && embed) writes(embed_unit(), true);
  if (!part_.vocab_split()) {
    // Whole head (tp = 1, or replicated over tp: x is whole on every rank, so each computes
    // the same loss, dx and head gradient).
    k_.lm_head_loss(losses, dx, dx ? gv_.head_w : nullptr, x, pv_.head_w, targets, N, C, V, grad_scale / float(N));
  } else {
    // Per row i: loss_i = log(sum_v exp(z_v - m)) + m - z_target, with m, the sum and
    // z_target all-reduced over the vocabulary parts; padded vocabulary columns are left out.
    const int64_t lo = part_.vocab_index() * Vl_, valid = std::clamp<int64_t>(V - lo, 0, Vl_);
    const int64_t R = std::max<int64_t>(1, std::min(N, kLogitBudgetFloats / Vl_));
    std::vector<float> logits(static_cast<size_t>(R * Vl_)), mx(static_cast<size_t>(R)), st(static_cast<size_t>(2 * R));
    const float scale = grad_scale / float(N);
    for (int64_t r0 = 0; r0 < N; r0 += R) {
      const int64_t rows = std::min(R, N - r0);
      k_.matmul_forward(logits.data(), x + r0 * C, pv_.head_w, nullptr, rows, C, Vl_);
      for (int64_t i = 0; i < rows; i++) {
        const float* z = logits.data() + i * Vl_;
        mx[size_t(i)] = valid > 0 ? *std::max_element(z, z + valid) : -INFINITY;
        const int64_t t = targets[r0 + i] - lo;
        st[size_t(rows + i)] = t >= 0 && t < valid ? z[t] : 0.0f;  // the target's logit, on its rank
      }
      vocab_comm_->all_reduce_max(mx.data(), rows);
      // Note [Vocabulary-parallel softmax]: e = exp(z - m) in place, and each row's share of the sum.
      k_.softmax_exp_rows(logits.data(), mx.data(), st.data(), rows, Vl_, valid);
      vocab_comm_->all_reduce_sum(st.data(), 2 * rows);
      for (int64_t i = 0; i < rows; i++)
        losses[r0 + i] = targets[r0 + i] == kIgnoreTarget
                             ? 0.0f
                             : float(std::log(double(st[size_t(i)])) + mx[size_t(i)] - st[size_t(rows + i)]);
      if (!dx) continue;
      // dz_v = scale * (softmax_v - [v == target]) = e_v * scale / sum - scale [v == target].
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < rows; i++) {
        float* e = logits.data() + i * Vl_;
        if (targets[r0 + i] == kIgnoreTarget) {
          std::fill(e, e + Vl_, 0.0f);
          continue;
        }
        const float k = scale / st[size_t(i)];
        for (int64_t v = 0; v < valid; v++) e[v] *= k;
        const int64_t t = targets[r0 + i] - lo;
        if (t >= 0 && t < valid) e[t] -= scale;
      }
      k_.matmul_backward(dx + r0 * C, gv_.head_w, nullptr, logits.data(), x + r0 * C, pv_.head_w, rows, C, Vl_, false);
      vocab_sum(dx + r0 * C, rows * C, last_stage_root());  // each rank's columns give part of dL/dx
    }
  }
  if (dx && embed) writes(embed_unit(), false);
  if (dx && own) writes(head_unit(), false);
  if (embed) use(embed_unit(), false);
  if (own) use(head_unit(), false);
  span("head", -1, false);
  double s = 0;
  for (int64_t i = 0; i < N; i++) s += losses[i];
  return float(s / double(N));
}

// Note [Vocabulary passes] (parallel/schedule.h): this rank's share of each pass. What one
// stage holds (the last stage's norm output, the first stage's embedding gradient) is
// broadcast from it, one rank speaking for its tp group's equal copies
// (ModelPart::vocab_speaker); what every rank adds to (the lookups, the head's input
// gradient) is reduced onto the stage that needs it, all-reduced where that is a tp group.
void Model::vocab_sum(float* x, int64_t n, int root) const {
  if (part_.pp_vocab() && part_.vocab_parts() == part_.vocab_pp) vocab_comm_->reduce_sum(x, n, root);
  else vocab_comm_->all_reduce_sum(x, n);
}

void Model::vocab_lookup(float* out, const int32_t* tokens, int64_t B, int64_t T) {
  LOOM_ASSERT(part_.pp_vocab());
  check_shape(B, T);
  check_ids(tokens, B * T, cfg_.vocab, "token");
  span("embedding", -1, true);
  use(embed_unit(), true);
  embed_forward(out, tokens, B, T);
  use(embed_unit(), false);
  span("embedding", -1, false);
}

std::vector<std::pair<const void*, int64_t>> Model::pass_buffers() const {
  std::vector<std::pair<const void*, int64_t>> out;
  for (const std::vector<float>* v : {&vocab_x_, &vocab_dx_})
    if (!v->empty()) out.emplace_back(v->data(), int64_t(v->size() * sizeof(float)));
  return out;
}

FlatRange Model::vocab_range() const {
  if (!part_.pp_vocab()) return {0, 0};
  int64_t end = 0;
  for (const char* name : {"wte", "head.w", "wpe"})
    if (const ParamSpec* s = layout_.find(name)) end = std::max(end, s->offset + s->numel);
  const ParamSpec* wte = layout_.find("wte");
  LOOM_ASSERT(wte && wte->offset == 0, "the vocabulary tensors lead the layout under pp_vocab");
  return {0, end};
}

float Model::vocab_head(int s, const int32_t* targets, int64_t B, int64_t T, float grad_scale, bool backward) {
  LOOM_ASSERT(part_.pp_vocab());
  check_shape(B, T);
  const int64_t N = B * T, C = cfg_.d_model;
  Slot* sl = part_.head ? &slot(chunks() - 1, s) : nullptr;
  vocab_x_.resize(size_t(N * C));
  if (sl && part_.vocab_speaker()) std::memcpy(vocab_x_.data(), sl->normf, size_t(N * C) * sizeof(float));
  vocab_comm_->broadcast(vocab_x_.data(), N * C, last_stage_root());
  if (backward) vocab_dx_.assign(size_t(N * C), 0.0f);
  const float loss = head_loss(vocab_x_.data(), targets, N, backward ? vocab_dx_.data() : nullptr, grad_scale);
  if (backward && sl) std::memcpy(sl->dnormf, vocab_dx_.data(), size_t(N * C) * sizeof(float));
  return loss;
}

void Model::vocab_embed_grad(const float* dout, const int32_t* tokens, int64_t B, int64_t T) {
  LOOM_ASSERT(part_.pp_vocab());
  check_shape(B, T);
  const int64_t N = B * T, C = cfg_.d_model;
  vocab_x_.resize(size_t(N * C));
  if (part_.embed) dout = gather_grad(dout, N);  // sequence parallel: the tp ranks' rows, whole
  if (part_.embed && part_.vocab_speaker()) std::memcpy(vocab_x_.data(), dout, size_t(N * C) * sizeof(float));
  vocab_comm_->broadcast(vocab_x_.data(), N * C, 0);  // the first stage's speaker is part 0
  span("embedding backward", -1, true);
  writes(embed_unit(), true);
  embed_backward(vocab_x_.data(), tokens, B, T);
  writes(embed_unit(), false);
  span("embedding backward", -1, false);
}

}  // namespace loom
