// Ring attention in the model (Note [Ring attention] in kernels/ops.inc): parallel.cp_mode =
// ring. A rank keeps its query rows; the cp ranks' K|V blocks (B,T,2 KV hd) go around the cp
// ring, rank r holding at step s the block of rank (r - s) mod cp, and each step's send of
// the block onward runs while the step computes on it. Backward passes each block round
// again with its dK|dV travelling beside it: at step s the rank adds its rows' share into
// the block it holds and hands block and gradient on; after cp steps every gradient is back
// with its owner and is added into the owner's dqkv. The K|V block moves while the step
// computes; the gradient, written by the step, moves after it. Between the passes a rank
// keeps each query row's log-sum-exp (B,H,T) in the layer's probs buffer, not P (B,H,T,cp T):
// the backward step recomputes its block's probabilities, so attention's saved state grows
// with T/cp, not with T^2/cp.
#include <cmath>
#include <utility>

#include "loom/core/error.h"
#include "loom/model/model.h"

namespace loom {

void Model::attend_ring(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                        const int32_t* doc_start) const {
  const int64_t hd = cfg_.head_dim(), kvrow = 2 * KVl_ * hd, block = B * T * kvrow;
  const int cp = cp_.size;
  cp_kv_.resize(size_t(2 * block));
  float *cur = cp_kv_.data(), *next = cur + block;
  take_kv_columns(cur, qkv, B * T);
  cp_out_.assign(size_t(B * T * Hl_ * hd), 0.0f);  // the unnormalised output
  cp_ml_.resize(size_t(B * Hl_ * T * 2));
  for (size_t i = 0; i < cp_ml_.size(); i += 2) cp_ml_[i] = -INFINITY, cp_ml_[i + 1] = 0.0f;
  for (int s = 0; s < cp; ++s) {
    const int src = (cp_.rank - s + cp) % cp;
    std::function<void()> arrived;
    if (s + 1 < cp) arrived = cp_.comm->ring_shift(cur, next, block);
    span("cp ring step", s, true);  // the kernel alone: the trace shows the shift beside it
    k_.ring_attention_step(cp_out_.data(), cp_ml_.data(), qkv, cur, cp_positions(), cp_.positions[size_t(src)].data(),
                           B, T, T, Hl_, KVl_, hd, doc_start);
    span("cp ring step", s, false);
    if (arrived) arrived();
    std::swap(cur, next);
  }
  k_.ring_attention_finish(out, lse, cp_out_.data(), cp_ml_.data(), B, T, Hl_, hd);
}

void Model::attend_ring_backward(float* dqkv, const float* dout, GemmIn out_in, const float* qkv, const float* lse,
                                 int64_t B, int64_t T, const int32_t* doc_start) const {
  const int64_t hd = cfg_.head_dim(), kvrow = 2 * KVl_ * hd, block = B * T * kvrow;
  const int64_t C = Hl_ * hd;
  const int cp = cp_.size;
  const float* out = out_in.f;
  if (out_in.h) {  // kept in bf16: widened into cp_out_, the forward's accumulator
    cp_out_.resize(size_t(B * T * C));
    out = widen(cp_out_.data(), out_in.h, B * T * C);
  }
  // D (B,H,T) = rowsum(dO * O): every key's sum of p_j dP_j in one dot product a row (in
  // cp_ml_, the forward's (m, l) being done with).
  cp_ml_.resize(size_t(B * Hl_ * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hl_; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* dy = dout + (b * T + t) * C + h * hd;
        const float* o = out + (b * T + t) * C + h * hd;
        double d = 0;
        for (int64_t e = 0; e < hd; ++e) d += double(dy[e]) * o[e];
        cp_ml_[size_t((b * Hl_ + h) * T + t)] = float(d);
      }
  // Two blocks of K|V (held, arriving) and two of dK|dV (held, arriving).
  cp_kv_.resize(size_t(2 * block));
  cp_dkv_.assign(size_t(2 * block), 0.0f);
  float *kv = cp_kv_.data(), *kv_next = kv + block, *dkv = cp_dkv_.data(), *dkv_next = dkv + block;
  take_kv_columns(kv, qkv, B * T);
  for (int s = 0; s < cp; ++s) {
    const int src = (cp_.rank - s + cp) % cp;
    std::function<void()> arrived;
    if (s + 1 < cp) arrived = cp_.comm->ring_shift(kv, kv_next, block);
    span("cp ring step", s, true);
    k_.ring_attention_backward_step(dqkv, dkv, dout, cp_ml_.data(), qkv, kv, lse, cp_positions(),
                                    cp_.positions[size_t(src)].data(), B, T, T, Hl_, KVl_, hd, doc_start);
    span("cp ring step", s, false);
    cp_.comm->ring_shift(dkv, dkv_next, block)();  // the gradient goes on to where its block goes next
    if (arrived) arrived();
    std::swap(kv, kv_next), std::swap(dkv, dkv_next);  // a shift overwrites the whole arriving block
  }
  // After cp shifts the gradient held is this rank's own block's, summed over every rank.
  add_kv_columns(dqkv, dkv, B * T);
}

}  // namespace loom
