// float instantiation of the templated reference kernels (ops_t.h).
#include <cmath>

#include "loom/kernels/ref/ops.h"
#include "loom/kernels/ref/ops_t.h"

namespace loom::ref {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T, int64_t C) {
  tmpl::embedding_forward<float>(out, tokens, wte, wpe, B, T, C);
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  tmpl::embedding_backward<float>(dwte, dwpe, dout, tokens, B, T, C);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N, int64_t C, float eps) {
  tmpl::layernorm_forward<float>(out, mean, rstd, inp, w, b, N, C, eps);
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
  tmpl::layernorm_backward<float>(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C, float eps) {
  tmpl::rmsnorm_forward<float>(out, rstd, inp, w, N, C, eps);
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd, int64_t N, int64_t C) {
  tmpl::rmsnorm_backward<float>(dinp, dw, dout, inp, w, rstd, N, C);
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t IC, int64_t OC) {
  tmpl::matmul_forward<float>(out, inp, w, bias, N, IC, OC);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int64_t N, int64_t IC, int64_t OC, bool fresh) {
  tmpl::matmul_backward<float>(dinp, dw, dbias, dout, inp, w, N, IC, OC, fresh);
}

void gelu_forward(float* out, const float* inp, int64_t n) {
  tmpl::gelu_forward<float>(out, inp, n);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  tmpl::gelu_backward<float>(dinp, inp, dout, n);
}

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
  tmpl::swiglu_forward<float>(out, inp, N, F);
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t F) {
  tmpl::swiglu_backward<float>(dinp, inp, dout, N, F);
}

void rope_forward(float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta, const int32_t* pos) {
  tmpl::rope_forward<float>(qkv, B, T, H, KV, hd, theta, pos);
}

void rope_backward(float* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta, const int32_t* pos) {
  tmpl::rope_backward<float>(dqkv, B, T, H, KV, hd, theta, pos);
}

void attention_forward(float* out, float* probs, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                       const int32_t* doc_start) {
  tmpl::attention_forward<float>(out, probs, qkv, B, T, H, KV, hd, doc_start);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  tmpl::attention_backward<float>(dqkv, dout, qkv, probs, B, T, H, KV, hd);
}

void cp_attention_forward(float* out, float* probs, const float* qkv, const float* kv, const int32_t* q_pos, int64_t B,
                          int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd, const int32_t* doc_start) {
  tmpl::cp_attention_forward<float>(out, probs, qkv, kv, q_pos, B, Tq, Tk, H, KV, hd, doc_start);
}

void cp_attention_backward(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                           const float* probs, const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                           int64_t KV, int64_t hd) {
  tmpl::cp_attention_backward<float>(dqkv, dkv, dout, qkv, kv, probs, q_pos, B, Tq, Tk, H, KV, hd);
}

void ring_attention_step(float* acc, float* ml, const float* qkv, const float* kv, const int32_t* q_pos,
                         const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tb, int64_t H, int64_t KV, int64_t hd,
                         const int32_t* doc_start) {
  tmpl::ring_attention_step<float>(acc, ml, qkv, kv, q_pos, k_pos, B, Tq, Tb, H, KV, hd, doc_start);
}

void ring_attention_finish(float* out, float* lse, const float* acc, const float* ml, int64_t B, int64_t Tq, int64_t H,
                           int64_t hd) {
  tmpl::ring_attention_finish<float>(out, lse, acc, ml, B, Tq, H, hd);
}

void ring_attention_backward_step(float* dqkv, float* dkv, const float* dout, const float* D, const float* qkv,
                                  const float* kv, const float* lse, const int32_t* q_pos, const int32_t* k_pos,
                                  int64_t B, int64_t Tq, int64_t Tb, int64_t H, int64_t KV, int64_t hd,
                                  const int32_t* doc_start) {
  tmpl::ring_attention_backward_step<float>(dqkv, dkv, dout, D, qkv, kv, lse, q_pos, k_pos, B, Tq, Tb, H, KV, hd,
                                            doc_start);
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
  tmpl::residual_forward<float>(out, a, b, n);
}

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N, int64_t V) {
  tmpl::crossentropy_forward<float>(losses, logits, targets, N, V);
}

void crossentropy_backward_inplace(float* logits, const int32_t* targets, const float* dloss, int64_t N, int64_t V) {
  tmpl::crossentropy_backward_inplace<float>(logits, targets, dloss, N, V);
}

void lm_head_loss(float* losses, float* dx, float* dw, const float* x, const float* w, const int32_t* targets, int64_t N, int64_t C, int64_t V, float dloss_scale) {
  tmpl::lm_head_loss<float>(losses, dx, dw, x, w, targets, N, C, V, dloss_scale);
}

void softmax_exp_rows(float* z, const float* mx, float* sums, int64_t rows, int64_t V, int64_t valid) {
  for (int64_t i = 0; i < rows; i++) {
    float* r = z + i * V;
    double sum = 0;
    for (int64_t v = 0; v < valid; v++) sum += (r[v] = float(std::exp(double(r[v]) - double(mx[i]))));
    for (int64_t v = valid; v < V; v++) r[v] = 0.0f;
    sums[i] = float(sum);
  }
}

void lm_head_logits_row(float* logits, const float* x, const float* w, int64_t C, int64_t V) {
  tmpl::lm_head_logits_row<float>(logits, x, w, C, V);
}

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
  tmpl::adamw_update<float>(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
}

double sum_squares(const float* x, int64_t n) {
  return tmpl::sum_squares<float>(x, n);
}

void scale_inplace(float* x, int64_t n, float s) {
  tmpl::scale_inplace<float>(x, n, s);
}

}  // namespace loom::ref
