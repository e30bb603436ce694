// Context parallelism in the model (Note [Context-parallel attention] in kernels/ops.inc,
// Note [Context-parallel chunks] in rank/cp_chunks.h): a rank computes its rows of every
// sequence; attention is the one place rows meet, so each layer gathers the cp group's keys
// and values (the all-gather scheme of Llama 3: K|V once per layer, not the queries), and
// backward sends every key's and value's gradient back to the rank that owns its row.
// Positions are the global ones: wpe and RoPE read them (position(), cp_positions()).
#include <algorithm>
#include <cstring>

#include "loom/core/error.h"
#include "loom/model/model.h"

namespace loom {

// K|V of this rank's T rows of qkv (B,T,(H+2KV)hd) into its block of cp_blocks_; the
// all-gather brings every rank's block (rank-major: rank, batch row, local row); cp_kv_
// (B,Tk,2 KV hd) holds them at their positions. Returns cp_kv_.
const float* Model::gather_kv(const float* qkv, int64_t B, int64_t T) const {
  const int64_t hd = cfg_.head_dim(), kvrow = 2 * KVl_ * hd, Tk = cp_.seq;
  const int64_t block = B * T * kvrow;
  cp_blocks_.resize(size_t(cp_.size * block));
  cp_kv_.resize(size_t(B * Tk * kvrow));
  take_kv_columns(cp_blocks_.data() + cp_.rank * block, qkv, B * T);
  cp_.comm->all_gather_blocks(cp_blocks_.data(), block);
  for (int r = 0; r < cp_.size; ++r) {
    const std::vector<int32_t>& pos = cp_.positions[size_t(r)];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(cp_kv_.data() + (b * Tk + pos[size_t(t)]) * kvrow, cp_blocks_.data() + r * block + (b * T + t) * kvrow,
                    size_t(kvrow) * sizeof(float));
  }
  return cp_kv_.data();
}

void Model::attend_cp(float* out, float* probs, bf16* probs_h, const float* qkv, int64_t B, int64_t T,
                      const int32_t* doc_start) const {
  const float* kv = gather_kv(qkv, B, T);
  if (k_.cp_attention_forward_bf16)  // Note [bf16 attention probabilities]
    k_.cp_attention_forward_bf16(out, probs, probs_h, qkv, kv, cp_positions(), B, T, cp_.seq, Hl_, KVl_,
                                 cfg_.head_dim(), doc_start);
  else
    k_.cp_attention_forward(out, probs, qkv, kv, cp_positions(), B, T, cp_.seq, Hl_, KVl_, cfg_.head_dim(), doc_start);
}

// The tokens travel as floats (exact: ids are below 2^24, the vocabulary's bound).
void Model::cp_doc_starts(const int32_t* tokens, int64_t B, int64_t T, std::vector<int32_t>& out) const {
  const int64_t Tk = cp_.seq, block = B * T;
  std::vector<float> blocks(size_t(cp_.size * block));
  for (int64_t n = 0; n < block; ++n) blocks[size_t(cp_.rank * block + n)] = float(tokens[n]);
  cp_.comm->all_gather_blocks(blocks.data(), block);
  std::vector<int32_t> whole(size_t(B * Tk)), start(size_t(B * Tk));
  for (int r = 0; r < cp_.size; ++r)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        whole[size_t(b * Tk + cp_.positions[size_t(r)][size_t(t)])] = int32_t(blocks[size_t(r * block + b * T + t)]);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0, s = 0; j < Tk; ++j) {
      start[size_t(b * Tk + j)] = int32_t(s);
      if (whole[size_t(b * Tk + j)] == doc_mask_token_) s = j + 1;
    }
  if (cp_.mode == CpMode::kUlysses) {  // Note [Ulysses attention]: the whole sequence's rows attend
    out = std::move(start);
    return;
  }
  out.resize(size_t(block));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) out[size_t(b * T + t)] = start[size_t(b * Tk + position(t))];
}

// Backward gathers K|V again (they are not kept between forward and backward: Tk rows of
// them per layer would outweigh the rank's own activations). dL/dK|V of every position
// (B,Tk,2 KV hd) goes back to rank-major blocks; the reduce-scatter sums each rank's block
// over the group; the own block is added into dqkv's K|V columns.
void Model::attend_cp_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                               const bf16* probs_h, int64_t B, int64_t T) const {
  const int64_t hd = cfg_.head_dim(), kvrow = 2 * KVl_ * hd, Tk = cp_.seq;
  const int64_t block = B * T * kvrow;
  const float* kv = gather_kv(qkv, B, T);
  std::vector<float>& dkv = cp_dkv_;
  dkv.assign(size_t(B * Tk * kvrow), 0.0f);
  if (k_.cp_attention_backward_bf16)
    k_.cp_attention_backward_bf16(dqkv, dkv.data(), dout, qkv, kv, probs, probs_h, cp_positions(), B, T, Tk, Hl_, KVl_,
                                  hd);
  else
    k_.cp_attention_backward(dqkv, dkv.data(), dout, qkv, kv, probs, cp_positions(), B, T, Tk, Hl_, KVl_, hd);
  for (int r = 0; r < cp_.size; ++r) {
    const std::vector<int32_t>& pos = cp_.positions[size_t(r)];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(cp_blocks_.data() + r * block + (b * T + t) * kvrow, dkv.data() + (b * Tk + pos[size_t(t)]) * kvrow,
                    size_t(kvrow) * sizeof(float));
  }
  cp_.comm->reduce_scatter_blocks(cp_blocks_.data(), block);
  add_kv_columns(dqkv, cp_blocks_.data() + cp_.rank * block, B * T);
}

void Model::use_cp_length(int64_t T) {
  if (cp_.size <= 1 || T * cp_.size == cp_.seq) return;
  LOOM_CHECK(cp_.positions_at, "context parallelism was given no positions for a ", T * cp_.size,
             "-token sequence (it has them for ", cp_.seq, ")");
  cp_.seq = T * cp_.size;
  cp_.positions = cp_.positions_at(cp_.seq);
}

void Model::take_kv_columns(float* kv, const float* qkv, int64_t rows) const {
  const int64_t hd = cfg_.head_dim(), row = (Hl_ + 2 * KVl_) * hd, kvrow = 2 * KVl_ * hd;
  for (int64_t n = 0; n < rows; ++n) std::memcpy(kv + n * kvrow, qkv + n * row + Hl_ * hd, size_t(kvrow) * sizeof(float));
}

void Model::add_kv_columns(float* dqkv, const float* g, int64_t rows) const {
  const int64_t hd = cfg_.head_dim(), row = (Hl_ + 2 * KVl_) * hd, kvrow = 2 * KVl_ * hd;
  for (int64_t n = 0; n < rows; ++n) {
    float* d = dqkv + n * row + Hl_ * hd;
    const float* gr = g + n * kvrow;
    for (int64_t e = 0; e < kvrow; ++e) d[e] += gr[e];
  }
}

void Model::add_positions(float* x, int64_t B, int64_t T) const {
  const int64_t C = cfg_.d_model;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* p = pv_.wpe + position(t) * C;
      float* o = x + (b * T + t) * C;
      for (int64_t c = 0; c < C; ++c) o[c] += p[c];
    }
}

void Model::add_position_grads(const float* d, int64_t B, int64_t T) {
  const int64_t C = cfg_.d_model;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      float* g = gv_.wpe + position(t) * C;
      const float* r = d + (b * T + t) * C;
      for (int64_t c = 0; c < C; ++c) g[c] += r[c];
    }
}

}  // namespace loom
