// The model's linear layers: GEMMs on fp32 or bf16-stored inputs (Note [bf16 activation
// storage] in model.cc) and the tensor / sequence parallel collectives around them (Note
// [Tensor parallel], Note [Sequence parallel] in model.h); and attention at the model's
// precision (Note [bf16 attention probabilities] in kernels/ops_bf16.inc).
#include <cstring>

#include "loom/model/model.h"

namespace loom {

// out (Nr,C) = residual + inp (N,K) W^T + b for a row-parallel W: the partial products
// are all-reduced (bias added once, by tp rank 0) or, under sequence parallel,
// reduce-scattered to the own rows (bias added by every rank to its rows).
void Model::row_parallel(float* out, GemmIn inp, const float* w, const float* b, int64_t N, int64_t K,
                         const float* residual) const {
  const int64_t C = cfg_.d_model;
  if (!sp_) {
    mm_forward(out, inp, w, part_.tp_rank == 0 ? b : nullptr, N, K, C);
    tp_sum(out, N * C);
    k_.residual_forward(out, out, residual, N * C);
    return;
  }
  const int64_t n = rows(N);
  float* full = full_tmp();
  mm_forward(full, inp, w, nullptr, N, K, C);
  tp_comm_->reduce_scatter_blocks(full, n * C);
  const float* own = full + row0(N) * C;
  k_.residual_forward(out, own, residual, n * C);
  if (b)
    for (int64_t r = 0; r < n; r++)
      for (int64_t c = 0; c < C; c++) out[r * C + c] += b[c];
}

void Model::keep(const float* f, bf16* h, int64_t n) const {
  if (h) k_.to_bf16(h, f, n);
}

void Model::round_keep(float* f, bf16* h, int64_t n) const {
  if (!bf16_) return;
  if (!h) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) f[i] = round_bf16(f[i]);
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) {  // one pass: store and round in place
    h[i] = to_bf16(f[i]);
    f[i] = from_bf16(h[i]);
  }
}

const float* Model::widen(float* f, const bf16* h, int64_t n) const {
  if (!h) return f;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) f[i] = from_bf16(h[i]);
  return f;
}

void Model::attend(float* out, float* probs, bf16* probs_h, const float* qkv, int64_t B, int64_t T,
                   const int32_t* doc_start) const {
  if (cp_.size > 1 && cp_.mode == CpMode::kUlysses) return attend_ulysses(out, probs, probs_h, qkv, B, T, doc_start);
  if (keeps_lse()) return attend_ring(out, probs, qkv, B, T, doc_start);
  if (cp_.size > 1) return attend_cp(out, probs, probs_h, qkv, B, T, doc_start);
  const int64_t hd = cfg_.head_dim();
  if (k_.attention_forward_bf16) k_.attention_forward_bf16(out, probs, probs_h, qkv, B, T, Hl_, KVl_, hd, doc_start);
  else k_.attention_forward(out, probs, qkv, B, T, Hl_, KVl_, hd, doc_start);
}

void Model::attend_backward(float* dqkv, const float* dout, GemmIn out, const float* qkv, const float* probs,
                            const bf16* probs_h, int64_t B, int64_t T, const int32_t* doc_start) const {
  if (cp_.size > 1 && cp_.mode == CpMode::kUlysses)
    return attend_ulysses_backward(dqkv, dout, qkv, probs, probs_h, B, T);
  if (keeps_lse()) return attend_ring_backward(dqkv, dout, out, qkv, probs, B, T, doc_start);
  if (cp_.size > 1) return attend_cp_backward(dqkv, dout, qkv, probs, probs_h, B, T);
  const int64_t hd = cfg_.head_dim();
  if (k_.attention_backward_bf16) k_.attention_backward_bf16(dqkv, dout, qkv, probs, probs_h, B, T, Hl_, KVl_, hd);
  else k_.attention_backward(dqkv, dout, qkv, probs, B, T, Hl_, KVl_, hd);
}

void Model::mm_forward(float* out, GemmIn in, const float* w, const float* b, int64_t N, int64_t IC, int64_t OC) const {
  if (in.h) k_.matmul_forward_bf16_in(out, in.h, w, b, N, IC, OC);
  else k_.matmul_forward(out, in.f, w, b, N, IC, OC);
}

void Model::mm_backward(float* dinp, float* dw, float* db, const float* dout, GemmIn in, const float* w, int64_t N,
                        int64_t IC, int64_t OC, bool fresh) const {
  if (in.h) k_.matmul_backward_bf16_in(dinp, dw, db, dout, in.h, w, N, IC, OC, fresh);
  else k_.matmul_backward(dinp, dw, db, dout, in.f, w, N, IC, OC, fresh);
}

// dL/d(row-parallel output) for all N rows: the own rows d (Nr,C) gathered under sequence
// parallel, else d itself.
const float* Model::gather_grad(const float* d, int64_t N) const {
  if (!sp_) return d;
  const int64_t n = rows(N), C = cfg_.d_model;
  float* full = full_tmp();
  std::memcpy(full + row0(N) * C, d, size_t(n * C) * sizeof(float));
  tp_comm_->all_gather_blocks(full, n * C);
  return full;
}

// The column-parallel input gradient dfull (N,C) is a partial sum: all-reduce it, or
// reduce-scatter it to the own rows under sequence parallel.
void Model::reduce_input_grad(float* dfull, int64_t N) const {
  if (sp_) tp_comm_->reduce_scatter_blocks(dfull, rows(N) * cfg_.d_model);
  else tp_sum(dfull, N * cfg_.d_model);
}

}  // namespace loom
