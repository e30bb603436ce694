// Note [Ulysses attention]
// DeepSpeed-Ulysses (Jacobs et al. 2023, "System Optimizations for Enabling Training of
// Extreme Long Sequence Transformer Models", Section 3.1): an all-to-all turns this rank's T
// rows of all Hl heads into all Tk = cp T rows of Hl / cp heads; every rank runs the whole
// sequence's causal attention (document masks over the whole sequence) on its heads, and a
// second all-to-all returns the output's rows to their owners.
//   head group g (cp rank g's heads): q heads [g Hl/cp, (g+1) Hl/cp), k and v heads
//   [g KVl/cp, (g+1) KVl/cp): grouped-query attention's q -> kv map h -> h / (Hl / KVl) stays
//   inside a group, so cp must divide both Hl and KVl (the config check names the values).
// Backward: dout goes to heads, qkv goes to heads again (not kept between the passes: as
// large as the rank's own qkv), the whole-sequence attention backward runs, and dqkv goes
// back to rows, added into the rows' dqkv. probs (B, Hl/cp, Tk, Tk) is as large as the
// all-gather scheme's (B, Hl, T, Tk). The rows' positions are rank/cp_chunks' (zigzag or
// plain), so a head-sharded sequence is assembled in position order.
#include <cstring>

#include "loom/core/error.h"
#include "loom/model/model.h"

namespace loom {

// The all-to-all's blocks (cp of B T width floats, sent and received) sized; width: the
// columns of this rank's head group, the runs' heads / cp times hd each.
int64_t Model::ulysses_buffers(std::span<const HeadRun> runs, int64_t B, int64_t T, int64_t& width) const {
  width = 0;
  for (const HeadRun& h : runs) width += h.heads / cp_.size * cfg_.head_dim();
  const int64_t block = B * T * width;
  cp_blocks_.resize(size_t(cp_.size * block));
  cp_kv_.resize(size_t(cp_.size * block));
  return block;
}

// Rows -> heads: local (B,T,row) whose head runs `runs` split over the cp ranks; full
// (B,Tk,width) gets this rank's group of every run at every position, width = sum of the
// runs' heads / cp, times hd.
void Model::ulysses_to_heads(const float* local, int64_t row, std::span<const HeadRun> runs, int64_t B, int64_t T,
                             float* full) const {
  const int64_t hd = cfg_.head_dim(), cp = cp_.size, Tk = cp_.seq;
  int64_t width = 0;
  const int64_t block = ulysses_buffers(runs, B, T, width);
  for (int64_t g = 0; g < cp; ++g)
    for (int64_t n = 0; n < B * T; ++n) {
      float* d = cp_blocks_.data() + g * block + n * width;
      for (const HeadRun& h : runs) {
        const int64_t w = h.heads / cp * hd;
        std::memcpy(d, local + n * row + (h.first + g * (h.heads / cp)) * hd, size_t(w) * sizeof(float));
        d += w;
      }
    }
  cp_.comm->all_to_all_blocks(cp_blocks_.data(), cp_kv_.data(), block);
  for (int64_t s = 0; s < cp; ++s) {
    const std::vector<int32_t>& pos = cp_.positions[size_t(s)];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(full + (b * Tk + pos[size_t(t)]) * width, cp_kv_.data() + s * block + (b * T + t) * width,
                    size_t(width) * sizeof(float));
  }
}

// Heads -> rows, ulysses_to_heads' inverse: full (B,Tk,width) of this rank's group back to
// the rows' owners; local's run columns are overwritten, or added to when `add`.
void Model::ulysses_to_rows(const float* full, int64_t row, std::span<const HeadRun> runs, int64_t B, int64_t T,
                            float* local, bool add) const {
  const int64_t hd = cfg_.head_dim(), cp = cp_.size, Tk = cp_.seq;
  int64_t width = 0;
  const int64_t block = ulysses_buffers(runs, B, T, width);
  for (int64_t s = 0; s < cp; ++s) {
    const std::vector<int32_t>& pos = cp_.positions[size_t(s)];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(cp_blocks_.data() + s * block + (b * T + t) * width, full + (b * Tk + pos[size_t(t)]) * width,
                    size_t(width) * sizeof(float));
  }
  cp_.comm->all_to_all_blocks(cp_blocks_.data(), cp_kv_.data(), block);
  for (int64_t g = 0; g < cp; ++g)
    for (int64_t n = 0; n < B * T; ++n) {
      const float* src = cp_kv_.data() + g * block + n * width;
      for (const HeadRun& h : runs) {
        const int64_t w = h.heads / cp * hd;
        float* d = local + n * row + (h.first + g * (h.heads / cp)) * hd;
        if (add)
          for (int64_t e = 0; e < w; ++e) d[e] += src[e];
        else
          std::memcpy(d, src, size_t(w) * sizeof(float));
        src += w;
      }
    }
}

void Model::attend_ulysses(float* out, float* probs, bf16* probs_h, const float* qkv, int64_t B, int64_t T,
                           const int32_t* doc_start) const {
  const int64_t hd = cfg_.head_dim(), cp = cp_.size, Tk = cp_.seq, Hc = Hl_ / cp, KVc = KVl_ / cp;
  const HeadRun qkv_runs[] = {{0, Hl_}, {Hl_, KVl_}, {Hl_ + KVl_, KVl_}}, out_runs[] = {{0, Hl_}};
  cp_heads_.resize(size_t(B * Tk * (Hc + 2 * KVc) * hd));
  cp_out_.resize(size_t(B * Tk * Hc * hd));
  ulysses_to_heads(qkv, (Hl_ + 2 * KVl_) * hd, qkv_runs, B, T, cp_heads_.data());
  // train.precision = bf16: the whole sequence's attention with bf16 probabilities, as one
  // rank runs it (Note [bf16 attention probabilities]).
  if (k_.attention_forward_bf16)
    k_.attention_forward_bf16(cp_out_.data(), probs, probs_h, cp_heads_.data(), B, Tk, Hc, KVc, hd, doc_start);
  else
    k_.attention_forward(cp_out_.data(), probs, cp_heads_.data(), B, Tk, Hc, KVc, hd, doc_start);
  ulysses_to_rows(cp_out_.data(), Hl_ * hd, out_runs, B, T, out, false);
}

void Model::attend_ulysses_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                                    const bf16* probs_h, int64_t B, int64_t T) const {
  const int64_t hd = cfg_.head_dim(), cp = cp_.size, Tk = cp_.seq, Hc = Hl_ / cp, KVc = KVl_ / cp;
  const HeadRun qkv_runs[] = {{0, Hl_}, {Hl_, KVl_}, {Hl_ + KVl_, KVl_}}, out_runs[] = {{0, Hl_}};
  cp_heads_.resize(size_t(B * Tk * (Hc + 2 * KVc) * hd));
  cp_out_.resize(size_t(B * Tk * Hc * hd));
  ulysses_to_heads(qkv, (Hl_ + 2 * KVl_) * hd, qkv_runs, B, T, cp_heads_.data());
  ulysses_to_heads(dout, Hl_ * hd, out_runs, B, T, cp_out_.data());
  std::vector<float>& dheads = cp_dkv_;
  dheads.assign(cp_heads_.size(), 0.0f);
  if (k_.attention_backward_bf16)
    k_.attention_backward_bf16(dheads.data(), cp_out_.data(), cp_heads_.data(), probs, probs_h, B, Tk, Hc, KVc, hd);
  else
    k_.attention_backward(dheads.data(), cp_out_.data(), cp_heads_.data(), probs, B, Tk, Hc, KVc, hd);
  ulysses_to_rows(dheads.data(), (Hl_ + 2 * KVl_) * hd, qkv_runs, B, T, dqkv, true);
}

}  // namespace loom
