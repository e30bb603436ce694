// Note [CUDA attention]
// Head sizes flash attention does not take (Note [CUDA flash attention] in flash.cu: 32,
// 64) run attention as cuBLAS batched GEMMs around a causal softmax kernel, per (b, h):
//   S = scale Q K^T (fp32, (T,T)), P = softmax_causal(S) (bf16, kept for backward), O = P V;
//   backward: dP = dO V^T, dV = P^T dO, dS = P (dP - rowsum(P dP)) scale, dQ = dS K,
//   dK = dS^T Q. The (B,H,T,T) probabilities are materialised (2 bytes each per layer) and
//   the masked half of each score GEMM is computed and discarded. The tests keep this
//   path as flash attention's second reference.
#include "loom/cuda/model.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "loom/core/error.h"
#include "loom/cuda/blas.h"
#include "loom/cuda/check.h"
#include "loom/cuda/fp8_linear.h"
#include "loom/cuda/nccl.h"
#include "loom/cuda/ops.h"
#include "loom/cuda/profile.h"
#include "loom/optim/optimizer.h"

namespace loom::cuda {

namespace {

// Bump allocator over one device allocation: every piece 256-byte aligned.
class Arena {
 public:
  template <class T>
  T* take(int64_t n) {
    const int64_t at = used_;
    used_ += (n * int64_t(sizeof(T)) + 255) / 256 * 256;
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  int64_t used() const { return used_; }
  void start(char* base) { base_ = base, used_ = 0; }

 private:
  char* base_ = nullptr;
  int64_t used_ = 0;
};

struct LayerActs {
  bf16* ln1;                    // (N,C)
  float *ln1_mean, *ln1_rstd;   // (N)
  bf16* qkv;                    // (N,Q), after RoPE for Llama
  bf16* P;                      // (B,H,T,T) softmax probabilities (materialised attention)
  float* lse;                   // (B,H,T) flash attention's row statistics
  bf16* atty;                   // (N,H*hd)
  float* x1;                    // (N,C) residual after attention
  bf16* ln2;
  float *ln2_mean, *ln2_rstd;
  bf16* fch;  // (N,F2) MLP pre-activation
  bf16* fcg;  // (N,F) activation output
};

}  // namespace

struct CudaModel::Impl {
  ModelConfig m;
  int64_t maxB, T, C, H, KV, hd, Q, F, F2, V;
  int64_t Vp;  // logits row stride: V rounded up to 64 (aligned rows for the GEMMs)
  int64_t head_rows;  // classifier rows per chunk: (rows, V) logits at a time, never (B,T,V)
  cudaStream_t s = nullptr;
  std::unique_ptr<Blas> blas;
  std::unique_ptr<Profile> prof;  // Note [CUDA profile]
  std::unique_ptr<Fp8Linears> fp8;  // Note [CUDA fp8 linear layers]; null: bf16 GEMMs
  bool fp8_stale = true;            // the weights changed since their fp8 copies were cast
  char* mem = nullptr;
  float *params, *grads, *mom1, *mom2;
  std::vector<bool> full;  // per layer: full recompute (its activations live in the shared set)
  int scratch_owner = -1;  // the full-recompute layer whose activations the shared set holds
  bf16* params_h;
  ModelView pv, gv;
  std::vector<float*> res;  // L+1 residual streams (N,C) fp32: layer inputs, then the final output
  std::vector<LayerActs> acts;
  bool flash = true;                    // Note [CUDA flash attention]; else Note [CUDA attention]
  bf16 *q, *k, *v, *oh, *dq, *dk, *dv;  // (B,H,T,hd) heads (materialised)
  float* S;                             // (B,H,T,T) scores, then dP (materialised)
  bf16* dS;                             // (B,H,T,T) (materialised)
  FlashScratch fs{};                    // flash backward's fp32 delta (and dk, dv for KV < H)
  float *dres, *dnorm;                  // (N,C)
  bf16 *dres_h, *datty, *dqkv, *dfcg, *dfch;
  bf16* lnf;
  float *lnf_mean, *lnf_rstd, *dlnf;
  bf16* logits;  // (head_rows, Vp), bf16 like autocast's; the loss overwrites them with their gradient
  bf16* head_h;   // (Vp, C): the head weight's bf16 copy, rows >= V zero (refresh_head)
  float* losses;  // (N)
  float* colsum;  // column-sum scratch
  double* dscratch;
  double* norm_out;        // the squared gradient norm (device)
  double norm_sq_host = 0;  // its copy, made by take_loss
  // AdamW's weight-decay runs (optim::decay_runs with decay 1): host copy, and on the device
  // their starts and 0/1 flags for one launch over the whole buffer (ops.h adamw_runs).
  std::vector<DecayRun> runs;
  int64_t* run_start = nullptr;
  float* run_decay = nullptr;
  int64_t total = 0;  // floats in the flat buffers
  float* loss_slots;  // one per micro-batch since take_loss, then forward_loss's
  int64_t loss_count = 0;
  std::vector<int64_t> loss_rows;  // N of each slot
  int32_t *tok, *tgt;
  int32_t *tok_host, *tgt_host;  // pinned staging
  cudaEvent_t staged = nullptr;   // recorded after the staging buffer's last copy to the device

  bool gpt() const { return m.arch == Arch::kGpt; }
  bf16* h(const float* p) const { return p ? params_h + (p - params) : nullptr; }
  // The LM head's GEMMs over V = 50257 columns (an odd count) ran at 100-125 TFLOP/s on an
  // H100; padded to Vp rows of zeros (and dlogits with zero columns) they run as the other
  // GEMMs do. Called wherever params_h changes.
  void refresh_head() {
    const float* w = gpt() ? pv.wte : pv.head_w;
    LOOM_CUDA_OK(cudaMemcpyAsync(head_h, h(w), size_t(V * C) * 2, cudaMemcpyDeviceToDevice, s));
  }
  void carve(Arena& a, int64_t total_floats);
  void update(const OptimConfig& o, double lr, int64_t step, double grad_scale, const double* norm_sq);
  void stage_tokens(const int32_t* tokens, const int32_t* targets, int64_t N);
  void forward(int64_t B, int64_t T);
  void forward_block(int l, int64_t B, int64_t T);
  void attention_forward(const LayerActs& a, int64_t B, int64_t T);
  void attention_backward(const LayerActs& a, int64_t B, int64_t T);
  void backward_block(int l, int64_t B, int64_t T);
  void head(int64_t N, bool backward, float dscale);
  void norm_fwd(bf16* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t N);
  // Linear layer j (0 qkv, 1 attention projection, 2 fc, 3 MLP projection) of block l, in
  // fp8 where fp8 is set (no bias then), else Blas::linear_*: y = x W^T [+ bias] [+ residual];
  // backward dx = dy W (skipped where dx is null) and dw += dy^T x.
  void linear(int l, int j, void* y, Dt t, const float* residual, const bf16* x, const bf16* w, const void* bias,
              int64_t N, int64_t IC, int64_t OC) {
    if (!fp8) return blas->linear_forward(y, t, x, w, bias, residual, N, IC, OC);
    LOOM_CHECK(!bias, "fp8 linear layers have no bias");
    fp8->forward(*blas, l, j, y, t, residual, x, N);
  }
  void linear_back(int l, int j, void* dx, Dt t, float* dw, const bf16* dy, const bf16* x, const bf16* w, int64_t N,
                   int64_t IC, int64_t OC) {
    if (fp8) return fp8->backward(*blas, l, j, dx, t, dw, dy, N);
    if (dx) blas->linear_backward_input(dx, t, dy, w, N, IC, OC);
    blas->linear_backward_weight(dw, dy, x, N, IC, OC);
  }
  void cast_fp8_weights() {
    if (!fp8 || !fp8_stale) return;
    std::vector<std::array<const bf16*, 4>> w;
    for (const BlockView& b : pv.blocks) w.push_back({h(b.qkv_w), h(b.attn_proj_w), h(b.fc_w), h(b.mlp_proj_w)});
    fp8->cast_weights(w);
    fp8_stale = false;
  }
};

void CudaModel::Impl::carve(Arena& a, int64_t total) {
  const int64_t N = maxB * T, L = m.layers, BHTT = maxB * H * T * T, heads = maxB * H * T * hd;
  params = a.take<float>(total), grads = a.take<float>(total), mom1 = a.take<float>(total), mom2 = a.take<float>(total);
  params_h = a.take<bf16>(total);
  res.assign(size_t(L + 1), nullptr);
  for (auto& r : res) r = a.take<float>(N * C);
  auto take_acts = [&](LayerActs& x) {
    x.ln1 = a.take<bf16>(N * C), x.ln1_mean = a.take<float>(N), x.ln1_rstd = a.take<float>(N);
    x.qkv = a.take<bf16>(N * Q), x.atty = a.take<bf16>(N * H * hd);
    x.P = flash ? nullptr : a.take<bf16>(BHTT);
    x.lse = flash ? a.take<float>(maxB * H * T) : nullptr;
    x.x1 = a.take<float>(N * C);
    x.ln2 = a.take<bf16>(N * C), x.ln2_mean = a.take<float>(N), x.ln2_rstd = a.take<float>(N);
    x.fch = a.take<bf16>(N * F2), x.fcg = a.take<bf16>(N * F);
  };
  acts.assign(size_t(L), {});
  LayerActs shared{};
  bool have_shared = false;
  for (int64_t l = 0; l < L; l++) {
    if (!full[size_t(l)]) {
      take_acts(acts[size_t(l)]);
      continue;
    }
    if (!have_shared) take_acts(shared), have_shared = true;
    acts[size_t(l)] = shared;
  }
  if (flash) {
    if (KV < H) fs.dk = a.take<float>(heads), fs.dv = a.take<float>(heads);
    fs.delta = a.take<float>(maxB * H * T);
  } else {
    q = a.take<bf16>(heads), k = a.take<bf16>(heads), v = a.take<bf16>(heads), oh = a.take<bf16>(heads);
    dq = a.take<bf16>(heads), dk = a.take<bf16>(heads), dv = a.take<bf16>(heads);
    S = a.take<float>(BHTT), dS = a.take<bf16>(BHTT);
  }
  dres = a.take<float>(N * C), dnorm = a.take<float>(N * C);
  dres_h = a.take<bf16>(N * C), datty = a.take<bf16>(N * H * hd), dqkv = a.take<bf16>(N * Q);
  dfcg = a.take<bf16>(N * F), dfch = a.take<bf16>(N * F2);
  lnf = a.take<bf16>(N * C), lnf_mean = a.take<float>(N), lnf_rstd = a.take<float>(N), dlnf = a.take<float>(N * C);
  logits = a.take<bf16>(head_rows * Vp);
  head_h = a.take<bf16>(Vp * C);
  losses = a.take<float>(N);
  colsum = a.take<float>(std::max(norm_scratch_floats(N, C), bias_scratch_floats(N, std::max(Q, F2))));
  dscratch = a.take<double>(1024), norm_out = a.take<double>(1);
  run_start = a.take<int64_t>(int64_t(runs.size())), run_decay = a.take<float>(int64_t(runs.size()));
  loss_slots = a.take<float>(1025);
  tok = a.take<int32_t>(N), tgt = a.take<int32_t>(N);
}

CudaModel::CudaModel(const ModelConfig& cfg, int64_t max_batch, int64_t T, bool flash,
                     const std::vector<Recompute>& recompute, bool fp8)
    : p_(new Impl), layout_(cfg) {
  Impl& p = *p_;
  p.flash = flash && flash_supported(cfg.head_dim());
  LOOM_CHECK(recompute.size() <= 1 || int64_t(recompute.size()) == cfg.layers, recompute.size(),
             " recompute policies for ", cfg.layers, " layers");
  p.full.assign(size_t(cfg.layers), false);
  for (int64_t l = 0; l < cfg.layers; l++) {
    const Recompute r = recompute.empty() ? Recompute::kNone : recompute[recompute.size() == 1 ? 0 : size_t(l)];
    LOOM_CONFIG_CHECK(r != Recompute::kSelective || p.flash, "parallel.recompute = selective on the GPU is what flash ",
                      "attention does (no (B,H,T,T) tensor kept), but head size ", cfg.head_dim(),
                      " runs the materialised attention, which keeps it: use none or full");
    p.full[size_t(l)] = r == Recompute::kFull;
  }
  p.m = cfg, p.maxB = max_batch, p.T = T;
  p.C = cfg.d_model, p.H = cfg.heads, p.KV = cfg.kv_heads, p.hd = cfg.head_dim();
  p.Q = (p.H + 2 * p.KV) * p.hd, p.F = cfg.ffn, p.F2 = cfg.arch == Arch::kGpt ? p.F : 2 * p.F, p.V = cfg.vocab;
  p.Vp = (p.V + 63) / 64 * 64;
  // Classifier chunks as large as 2 GiB of bf16 logits allow (their gradient overwrites
  // them): GPT-2's 16,384 rows in one chunk, so the head's weight gradient is one GEMM over
  // all rows instead of four accumulating into the fp32 gradient.
  const int64_t fit = (int64_t(2) << 30) / (2 * p.Vp);
  p.head_rows = std::min<int64_t>(max_batch * T, std::max<int64_t>(1024, fit / 1024 * 1024));
  LOOM_CONFIG_CHECK(T <= cfg.ctx, "train.seq = ", T, " exceeds model.ctx = ", cfg.ctx);
  p.total = layout_.total_floats();
  p.runs = decay_runs(layout_, 1.0);
  Arena a;
  p.carve(a, layout_.total_floats());
  bytes_ = a.used();
  LOOM_CUDA_OK(cudaStreamCreateWithFlags(&p.s, cudaStreamNonBlocking));
  LOOM_CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&p.mem), size_t(bytes_)));
  a.start(p.mem);
  p.carve(a, layout_.total_floats());
  LOOM_CUDA_OK(cudaMemsetAsync(p.mem, 0, size_t(bytes_), p.s));  // padding floats must read zero
  std::vector<int64_t> starts;
  std::vector<float> decay;
  for (const DecayRun& r : p.runs) starts.push_back(r.offset), decay.push_back(r.weight_decay);
  LOOM_CUDA_OK(cudaMemcpyAsync(p.run_start, starts.data(), starts.size() * 8, cudaMemcpyHostToDevice, p.s));
  LOOM_CUDA_OK(cudaMemcpyAsync(p.run_decay, decay.data(), decay.size() * 4, cudaMemcpyHostToDevice, p.s));
  LOOM_CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(&p.tok_host), size_t(2 * max_batch * T) * sizeof(int32_t)));
  p.tgt_host = p.tok_host + max_batch * T;
  LOOM_CUDA_OK(cudaEventCreateWithFlags(&p.staged, cudaEventDisableTiming));
  p.pv = make_view(layout_, cfg, p.params);
  p.gv = make_view(layout_, cfg, p.grads);
  p.blas = std::make_unique<Blas>(p.s);
  p.prof = std::make_unique<Profile>(p.s);
  if (fp8) {
    LOOM_CHECK(!p.gpt(), "fp8 linear layers run Llama's (no biases)");
    const std::array<Fp8Linears::Shape, 4> shapes = {
        {{p.C, p.Q}, {p.H * p.hd, p.C}, {p.C, p.F2}, {p.F, p.C}}};
    p.fp8 = std::make_unique<Fp8Linears>(cfg.layers, shapes, max_batch * T, p.s);
    bytes_ += p.fp8->device_bytes();
  }
  LOOM_CUDA_OK(cudaStreamSynchronize(p.s));
}

CudaModel::~CudaModel() {
  if (!p_) return;
  p_->prof.reset();
  p_->fp8.reset();
  p_->blas.reset();
  if (p_->s) cudaStreamSynchronize(p_->s);
  cudaFree(p_->mem);
  cudaFreeHost(p_->tok_host);
  if (p_->staged) cudaEventDestroy(p_->staged);
  if (p_->s) cudaStreamDestroy(p_->s);
}

bool CudaModel::flash() const { return p_->flash; }

void CudaModel::upload_params(const std::vector<float>& host) {
  LOOM_CHECK(int64_t(host.size()) == layout_.total_floats(), "parameter buffer of ", host.size(), " floats, layout has ",
             layout_.total_floats());
  LOOM_CUDA_OK(cudaMemcpyAsync(p_->params, host.data(), host.size() * 4, cudaMemcpyHostToDevice, p_->s));
  to_bf16(p_->params_h, p_->params, layout_.total_floats(), p_->s);
  p_->refresh_head();
  p_->fp8_stale = true;
  LOOM_CUDA_OK(cudaStreamSynchronize(p_->s));
}

namespace {
std::vector<float> download(const float* d, int64_t n, cudaStream_t s) {
  std::vector<float> out(static_cast<size_t>(n));
  LOOM_CUDA_OK(cudaMemcpyAsync(out.data(), d, size_t(n) * 4, cudaMemcpyDeviceToHost, s));
  LOOM_CUDA_OK(cudaStreamSynchronize(s));
  return out;
}
}  // namespace

std::vector<float> CudaModel::download_params() const { return download(p_->params, layout_.total_floats(), p_->s); }
std::vector<float> CudaModel::download_grads() const { return download(p_->grads, layout_.total_floats(), p_->s); }

void CudaModel::upload_moments(const std::vector<float>& m, const std::vector<float>& v) {
  const size_t n = size_t(layout_.total_floats());
  LOOM_CHECK(m.size() == n && v.size() == n, "moment buffers of ", m.size(), " and ", v.size(), " floats, layout has ", n);
  LOOM_CUDA_OK(cudaMemcpyAsync(p_->mom1, m.data(), n * 4, cudaMemcpyHostToDevice, p_->s));
  LOOM_CUDA_OK(cudaMemcpyAsync(p_->mom2, v.data(), n * 4, cudaMemcpyHostToDevice, p_->s));
  LOOM_CUDA_OK(cudaStreamSynchronize(p_->s));
}

void CudaModel::download_moments(std::vector<float>& m, std::vector<float>& v) const {
  m = download(p_->mom1, layout_.total_floats(), p_->s);
  v = download(p_->mom2, layout_.total_floats(), p_->s);
}

void CudaModel::zero_grads() {
  LOOM_CUDA_OK(cudaMemsetAsync(p_->grads, 0, size_t(layout_.total_floats()) * 4, p_->s));
}

void CudaModel::Impl::stage_tokens(const int32_t* tokens, const int32_t* targets, int64_t N) {
  // The pinned staging buffer may still feed the previous micro-batch's copy: wait for that
  // copy only (the stream's other work keeps running, so the GPU does not idle here).
  LOOM_CUDA_OK(cudaEventSynchronize(staged));
  std::copy(tokens, tokens + N, tok_host);
  std::copy(targets, targets + N, tgt_host);
  LOOM_CUDA_OK(cudaMemcpyAsync(tok, tok_host, size_t(N) * 4, cudaMemcpyHostToDevice, s));
  LOOM_CUDA_OK(cudaMemcpyAsync(tgt, tgt_host, size_t(N) * 4, cudaMemcpyHostToDevice, s));
  LOOM_CUDA_OK(cudaEventRecord(staged, s));
}

void CudaModel::Impl::norm_fwd(bf16* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                               int64_t N) {
  norm_forward(out, mean, rstd, x, w, gpt() ? b : nullptr, N, C, float(m.norm_eps), s);
}

void CudaModel::Impl::attention_forward(const LayerActs& a, int64_t B, int64_t T) {
  if (flash) return flash_forward(a.atty, a.lse, a.qkv, B, T, H, KV, hd, s);
  const int64_t TT = T * T, Thd = T * hd;
  split_heads(q, k, v, a.qkv, B, T, H, KV, hd, s);
  Blas::Batched g;  // S = scale Q K^T
  g.tb = true, g.M = T, g.N = T, g.K = hd, g.A = q, g.lda = hd, g.sa = Thd, g.B = k, g.ldb = hd, g.sb = Thd;
  g.C = S, g.ct = Dt::kF32, g.ldc = T, g.sc = TT, g.batch = B * H, g.alpha = float(1.0 / std::sqrt(double(hd)));
  blas->batched(g);
  softmax_causal_forward(a.P, S, B * H, T, s);
  Blas::Batched o;  // O = P V
  o.M = T, o.N = hd, o.K = T, o.A = a.P, o.lda = T, o.sa = TT, o.B = v, o.ldb = hd, o.sb = Thd;
  o.C = oh, o.ct = Dt::kBf16, o.ldc = hd, o.sc = Thd, o.batch = B * H;
  blas->batched(o);
  heads_to_rows(a.atty, oh, B, T, H, hd, s);
}

void CudaModel::Impl::forward_block(int l, int64_t B, int64_t T) {
  const int64_t N = B * T;
  if (full[size_t(l)]) scratch_owner = l;
  const BlockView& w = pv.blocks[size_t(l)];
  const LayerActs& a = acts[size_t(l)];
  prof->mark("norm");
  norm_fwd(a.ln1, a.ln1_mean, a.ln1_rstd, res[size_t(l)], w.norm1_w, w.norm1_b, N);
  prof->mark("gemm");
  linear(l, 0, a.qkv, Dt::kBf16, nullptr, a.ln1, h(w.qkv_w), h(w.qkv_b), N, C, Q);
  prof->mark("elementwise");
  if (!gpt()) rope(a.qkv, B, T, H, KV, hd, float(m.rope_theta), false, s);
  prof->mark("attention");
  attention_forward(a, B, T);
  prof->mark("gemm");
  linear(l, 1, a.x1, Dt::kF32, res[size_t(l)], a.atty, h(w.attn_proj_w), w.attn_proj_b, N, H * hd, C);
  prof->mark("norm");
  norm_fwd(a.ln2, a.ln2_mean, a.ln2_rstd, a.x1, w.norm2_w, w.norm2_b, N);
  prof->mark("gemm");
  // GPT: GELU in the GEMM's epilogue where cuBLASLt has it (Note [CUDA precision]).
  if (!gpt() || !blas->linear_forward_gelu(a.fcg, a.fch, a.ln2, h(w.fc_w), h(w.fc_b), N, C, F2)) {
    linear(l, 2, a.fch, Dt::kBf16, nullptr, a.ln2, h(w.fc_w), h(w.fc_b), N, C, F2);
    prof->mark("elementwise");
    if (gpt()) gelu_forward(a.fcg, a.fch, N * F, s);
    else swiglu_forward(a.fcg, a.fch, N, F, s);
  }
  prof->mark("gemm");
  linear(l, 3, res[size_t(l + 1)], Dt::kF32, a.x1, a.fcg, h(w.mlp_proj_w), w.mlp_proj_b, N, F, C);
}

void CudaModel::Impl::forward(int64_t B, int64_t T) {
  prof->mark("embedding");
  embedding_forward(res[0], tok, pv.wte, gpt() ? pv.wpe : nullptr, B, T, C, s);
  cast_fp8_weights();
  for (int l = 0; l < int(m.layers); l++) forward_block(l, B, T);
  prof->mark("norm");
  norm_fwd(lnf, lnf_mean, lnf_rstd, res[size_t(m.layers)], pv.normf_w, pv.normf_b, B * T);
}

// Losses of the N rows into `losses`; with backward, dlnf = dL/d(final norm output) and
// the head weight's gradient, from dloss = dscale per row.
void CudaModel::Impl::head(int64_t N, bool backward, float dscale) {
  float* dw = gpt() ? gv.wte : gv.head_w;
  for (int64_t r0 = 0; r0 < N; r0 += head_rows) {
    const int64_t rows = std::min(head_rows, N - r0);
    prof->mark("head gemm");
    blas->linear_forward(logits, Dt::kBf16, lnf + r0 * C, head_h, nullptr, nullptr, rows, C, Vp);
    prof->mark("head loss");
    crossentropy(losses + r0, backward ? logits : nullptr, logits, tgt + r0, rows, V, Vp, dscale, s);
    if (!backward) continue;
    prof->mark("head gemm dx");
    blas->linear_backward_input(dlnf + r0 * C, Dt::kF32, logits, head_h, rows, C, Vp);  // (now dlogits)
    prof->mark("head gemm dw");
    blas->linear_backward_weight(dw, logits, lnf + r0 * C, rows, C, V, Vp);
  }
}

void CudaModel::Impl::attention_backward(const LayerActs& a, int64_t B, int64_t T) {
  prof->mark("attention back");
  if (flash) return flash_backward(dqkv, datty, a.atty, a.qkv, a.lse, fs, B, T, H, KV, hd, s);
  const int64_t TT = T * T, Thd = T * hd, BH = B * H;
  rows_to_heads(oh, datty, B, T, H, hd, s);  // oh <- dO
  split_heads(q, k, v, a.qkv, B, T, H, KV, hd, s);
  Blas::Batched g;  // dP = dO V^T (fp32, into S)
  g.tb = true, g.M = T, g.N = T, g.K = hd, g.A = oh, g.lda = hd, g.sa = Thd, g.B = v, g.ldb = hd, g.sb = Thd;
  g.C = S, g.ct = Dt::kF32, g.ldc = T, g.sc = TT, g.batch = BH;
  blas->batched(g);
  Blas::Batched d;  // dV = P^T dO
  d.ta = true, d.M = T, d.N = hd, d.K = T, d.A = a.P, d.lda = T, d.sa = TT, d.B = oh, d.ldb = hd, d.sb = Thd;
  d.C = dv, d.ct = Dt::kBf16, d.ldc = hd, d.sc = Thd, d.batch = BH;
  blas->batched(d);
  softmax_causal_backward(dS, a.P, S, BH, T, float(1.0 / std::sqrt(double(hd))), s);
  Blas::Batched dqg = d;  // dQ = dS K
  dqg.ta = false, dqg.A = dS, dqg.B = k, dqg.C = dq;
  blas->batched(dqg);
  Blas::Batched dkg = d;  // dK = dS^T Q
  dkg.A = dS, dkg.B = q, dkg.C = dk;
  blas->batched(dkg);
  merge_heads(dqkv, dq, dk, dv, B, T, H, KV, hd, s);
}

void CudaModel::Impl::backward_block(int l, int64_t B, int64_t T) {
  const int64_t N = B * T;
  const BlockView& w = pv.blocks[size_t(l)];
  const BlockView& g = gv.blocks[size_t(l)];
  const LayerActs& a = acts[size_t(l)];
  // MLP: dres = dL/d(block output), dres_h its bf16 copy (made by the norm backward before).
  prof->mark("gemm back");
  const bool fused = gpt() && blas->linear_backward_input_dgelu(dfch, dres_h, h(w.mlp_proj_w), a.fch, N, F, C);
  linear_back(l, 3, fused ? nullptr : dfcg, Dt::kBf16, g.mlp_proj_w, dres_h, a.fcg, h(w.mlp_proj_w), N, F, C);
  // (mlp_proj_b's gradient, the column sums of dres, came with the norm backward that made dres)
  prof->mark("elementwise");
  if (!fused && gpt()) gelu_backward(dfch, a.fch, dfcg, N * F, s);
  if (!gpt()) swiglu_backward(dfch, a.fch, dfcg, N, F, s);
  prof->mark("gemm back");
  linear_back(l, 2, dnorm, Dt::kF32, g.fc_w, dfch, a.ln2, h(w.fc_w), N, C, F2);
  prof->mark("bias back");
  if (gpt()) bias_backward(g.fc_b, dfch, N, F2, colsum, s);
  prof->mark("norm back");
  norm_backward(dres, g.norm2_w, gpt() ? g.norm2_b : nullptr, dnorm, a.x1, w.norm2_w, a.ln2_mean, a.ln2_rstd, N, C,
                colsum, s, dres_h, gpt() ? g.attn_proj_b : nullptr);
  // Attention: dres = dL/d(x1).
  prof->mark("gemm back");
  linear_back(l, 1, datty, Dt::kBf16, g.attn_proj_w, dres_h, a.atty, h(w.attn_proj_w), N, H * hd, C);
  attention_backward(a, B, T);
  prof->mark("elementwise");
  if (!gpt()) rope(dqkv, B, T, H, KV, hd, float(m.rope_theta), true, s);
  prof->mark("gemm back");
  linear_back(l, 0, dnorm, Dt::kF32, g.qkv_w, dqkv, a.ln1, h(w.qkv_w), N, C, Q);
  prof->mark("bias back");
  if (gpt()) bias_backward(g.qkv_b, dqkv, N, Q, colsum, s);
  prof->mark("norm back");
  norm_backward(dres, g.norm1_w, gpt() ? g.norm1_b : nullptr, dnorm, res[size_t(l)], w.norm1_w, a.ln1_mean,
                a.ln1_rstd, N, C, colsum, s, dres_h, gpt() && l > 0 ? gv.blocks[size_t(l - 1)].mlp_proj_b : nullptr);
}

void CudaModel::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                                 float grad_scale) {
  Impl& p = *p_;
  LOOM_CHECK(B <= p.maxB && T == p.T, "micro-batch ", B, " x ", T, " but the model was sized for ", p.maxB, " x ",
             p.T);
  const int64_t N = B * T;
  if (p.loss_count == 1024) take_loss();  // keeps the per-micro-batch slots bounded
  p.stage_tokens(tokens, targets, N);
  p.forward(B, T);
  p.head(N, true, grad_scale / float(N));
  p.prof->mark("head loss");
  sum(p.loss_slots + p.loss_count++, p.losses, N, p.dscratch, p.s);
  p.loss_rows.push_back(N);
  p.prof->mark("norm back");
  LOOM_CUDA_OK(cudaMemsetAsync(p.dres, 0, size_t(N * p.C) * 4, p.s));
  norm_backward(p.dres, p.gv.normf_w, p.gpt() ? p.gv.normf_b : nullptr, p.dlnf, p.res[size_t(p.m.layers)],
                p.pv.normf_w, p.lnf_mean, p.lnf_rstd, N, p.C, p.colsum, p.s, p.dres_h,
                p.gpt() ? p.gv.blocks.back().mlp_proj_b : nullptr);
  for (int l = int(p.m.layers) - 1; l >= 0; l--) {
    if (p.full[size_t(l)] && p.scratch_owner != l) {  // full recompute: the block's forward again
      p.prof->mark("recompute");
      p.forward_block(l, B, T);
    }
    p.backward_block(l, B, T);
  }
  p.prof->mark("embedding back");
  embedding_backward(p.gv.wte, p.gpt() ? p.gv.wpe : nullptr, p.dres, p.tok, B, T, p.C, p.s);
}

double CudaModel::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  Impl& p = *p_;
  LOOM_CHECK(B <= p.maxB && T == p.T, "batch ", B, " x ", T, " but the model was sized for ", p.maxB, " x ", p.T);
  const int64_t N = B * T;
  p.stage_tokens(tokens, targets, N);
  p.forward(B, T);
  p.head(N, false, 0.0f);
  float* slot = p.loss_slots + 1024;  // never a training slot: take_loss drains at 1024
  sum(slot, p.losses, N, p.dscratch, p.s);
  float total = 0;
  LOOM_CUDA_OK(cudaMemcpyAsync(&total, slot, 4, cudaMemcpyDeviceToHost, p.s));
  LOOM_CUDA_OK(cudaStreamSynchronize(p.s));
  return double(total) / double(N);
}

double CudaModel::take_loss() {
  Impl& p = *p_;
  std::vector<float> sums(size_t(p.loss_count));
  if (p.loss_count > 0)
    LOOM_CUDA_OK(cudaMemcpyAsync(sums.data(), p.loss_slots, sums.size() * 4, cudaMemcpyDeviceToHost, p.s));
  LOOM_CUDA_OK(cudaMemcpyAsync(&p.norm_sq_host, p.norm_out, 8, cudaMemcpyDeviceToHost, p.s));
  LOOM_CUDA_OK(cudaStreamSynchronize(p.s));
  p.prof->collect(1);
  double mean = 0;
  for (size_t i = 0; i < sums.size(); i++) mean += double(sums[i]) / double(p.loss_rows[i]);
  mean /= double(std::max<int64_t>(1, p.loss_count));
  p.loss_count = 0;
  p.loss_rows.clear();
  return mean;
}

double CudaModel::grad_norm() {
  Impl& p = *p_;
  p.prof->mark("optimizer");
  sum_squares(p.norm_out, p.grads, layout_.total_floats(), p.dscratch, p.s);
  double ss = 0;
  LOOM_CUDA_OK(cudaMemcpyAsync(&ss, p.norm_out, 8, cudaMemcpyDeviceToHost, p.s));
  LOOM_CUDA_OK(cudaStreamSynchronize(p.s));
  p.prof->collect();
  return std::sqrt(ss);
}

// AdamW over the runs of equal weight decay that the CPU's AdamW uses (optim::decay_runs),
// in one launch where the buffers allow it (they do: 256-byte aligned, runs at multiples of
// ParamLayout::kAlignFloats), else a launch per run. norm_sq: clip on the device (ops.h
// adamw), else scale the gradients by grad_scale.
void CudaModel::Impl::update(const OptimConfig& o, double lr, int64_t step, double grad_scale, const double* norm_sq) {
  if (fp8) fp8->update_scales(), fp8_stale = true;  // the step's amaxes are in; the weights change below
  bool one_launch = total % 4 == 0;
  for (const DecayRun& r : runs) one_launch = one_launch && r.offset % 4 == 0;
  if (one_launch)
    return adamw_runs(params, params_h, grads, mom1, mom2, total, run_start, run_decay, int(runs.size()), float(lr),
                      float(o.beta1), float(o.beta2), float(o.eps), float(o.weight_decay), step, float(grad_scale), s,
                      norm_sq, o.grad_clip);
  for (const DecayRun& r : runs) {
    const int64_t lo = r.offset;
    adamw(params + lo, params_h + lo, grads + lo, mom1 + lo, mom2 + lo, r.count, float(lr), float(o.beta1),
          float(o.beta2), float(o.eps), r.weight_decay * float(o.weight_decay), step, float(grad_scale), s, norm_sq,
          o.grad_clip);
  }
}

void CudaModel::adamw_step(const OptimConfig& o, double lr, int64_t step, double grad_scale) {
  Impl& p = *p_;
  p.prof->mark("optimizer");
  p.update(o, lr, step, grad_scale, nullptr);
  p.refresh_head();
}

void CudaModel::clip_and_step(const OptimConfig& o, double lr, int64_t step) {
  Impl& p = *p_;
  p.prof->mark("optimizer");
  sum_squares(p.norm_out, p.grads, layout_.total_floats(), p.dscratch, p.s);
  p.update(o, lr, step, 1.0, p.norm_out);
  p.refresh_head();
}

double CudaModel::last_grad_norm() const { return std::sqrt(p_->norm_sq_host); }

void CudaModel::all_reduce_grads(Nccl& nccl) {
  p_->prof->mark("dp all-reduce");
  nccl.all_reduce_sum(p_->grads, layout_.total_floats(), p_->s);
}

void CudaModel::broadcast_params(Nccl& nccl) {
  nccl.broadcast(p_->params, layout_.total_floats(), 0, p_->s);
  to_bf16(p_->params_h, p_->params, layout_.total_floats(), p_->s);
  p_->refresh_head();
  p_->fp8_stale = true;
  nccl.wait(p_->s, "parameter broadcast");
}

void CudaModel::wait(Nccl& nccl, const std::string& what) { nccl.wait(p_->s, what); }

}  // namespace loom::cuda
