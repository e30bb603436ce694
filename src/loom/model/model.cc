#include "loom/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "loom/core/error.h"

namespace loom {

// Saved activations (per block) and backward scratch, carved from one allocation.
// N = B*T rows; Q = (H + 2 KV) * hd; F2 = F (GPT) or 2F (Llama gate|up).
struct Model::Acts {
  struct Block {
    float *norm1, *norm1_mean, *norm1_rstd;  // (N,C), (N), (N)
    float* qkv;                              // (N,Q), after RoPE for Llama
    float* probs;                            // (B,H,T,T)
    float* atty;                             // (N,H*hd)
    float* x1;                               // (N,C) residual after attention
    float *norm2, *norm2_mean, *norm2_rstd;
    float* fch;                              // (N,F2) fc output, pre-activation
    float* fcg;                              // (N,F) activation output
    float* out;                              // (N,C) block output = next block's input
  };
  std::unique_ptr<float[]> storage;
  int64_t floats = 0;
  float* embed = nullptr;  // (N,C) block 0 input
  std::vector<Block> blocks;
  float *normf, *normf_mean, *normf_rstd;
  float* losses;  // (N)
  // backward scratch
  float *dres, *dnorm, *datty, *dqkv, *dfch, *dfcg;
};

namespace {
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += (n + 15) / 16 * 16;
    return p;
  }
  int64_t used() const { return used_; }

 private:
  float* base_;
  int64_t used_ = 0;
};

}  // namespace

Model::Model(const ModelConfig& cfg, int64_t max_batch, int64_t max_seq, KernelBackend backend,
             const LayoutPadding& padding)
    : cfg_(cfg), layout_(cfg, padding), k_(kernels(backend)), max_batch_(max_batch), max_seq_(max_seq) {
  LOOM_CHECK(max_batch > 0 && max_seq > 0 && max_seq <= cfg.ctx, "model buffers need 0 < batch (", max_batch,
             ") and 0 < seq (", max_seq, ") <= model.ctx (", cfg.ctx, ")");
  params_.assign(layout_.total_floats(), 0.0f);
  grads_.assign(layout_.total_floats(), 0.0f);
  pv_ = make_view(layout_, cfg_, params_.data());
  gv_ = make_view(layout_, cfg_, grads_.data());
  block_first_tensor_.assign(cfg.layers, -1);
  for (int i = 0; i < int(layout_.specs().size()); i++) {
    const ParamSpec& s = layout_.specs()[i];
    if (s.layer >= 0 && block_first_tensor_[s.layer] < 0) block_first_tensor_[s.layer] = i;
    if (s.name == "normf.w") normf_tensor_ = i;
  }

  const int64_t N = max_batch * max_seq, C = cfg.d_model, hd = cfg.head_dim();
  const int64_t Q = (cfg.heads + 2 * cfg.kv_heads) * hd, HD = cfg.heads * hd;
  const int64_t F = cfg.ffn, F2 = cfg.arch == Arch::kGpt ? F : 2 * F;
  const int64_t P = max_batch * cfg.heads * max_seq * max_seq;
  acts_ = std::make_unique<Acts>();
  Acts& a = *acts_;
  // Two passes: measure, then allocate and carve.
  for (int pass = 0; pass < 2; pass++) {
    Carver c(pass == 0 ? nullptr : a.storage.get());
    a.embed = c.take(N * C);
    a.blocks.assign(cfg.layers, {});
    for (auto& b : a.blocks) {
      b.norm1 = c.take(N * C), b.norm1_mean = c.take(N), b.norm1_rstd = c.take(N);
      b.qkv = c.take(N * Q), b.probs = c.take(P), b.atty = c.take(N * HD), b.x1 = c.take(N * C);
      b.norm2 = c.take(N * C), b.norm2_mean = c.take(N), b.norm2_rstd = c.take(N);
      b.fch = c.take(N * F2), b.fcg = c.take(N * F), b.out = c.take(N * C);
    }
    a.normf = c.take(N * C), a.normf_mean = c.take(N), a.normf_rstd = c.take(N);
    a.losses = c.take(N);
    a.dres = c.take(N * C), a.dnorm = c.take(N * C), a.datty = c.take(N * HD);
    a.dqkv = c.take(N * Q), a.dfch = c.take(N * F2), a.dfcg = c.take(N * F);
    if (pass == 0) {
      a.floats = c.used();
      a.storage.reset(new float[a.floats]);  // uninitialised: pages are touched on first use
    }
  }
}

Model::~Model() = default;

int64_t Model::activation_bytes() const { return acts_->floats * int64_t(sizeof(float)); }

void Model::init_weights(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float std_proj = float(cfg_.init_std / std::sqrt(2.0 * double(cfg_.layers)));
  for (const ParamSpec& s : layout_.specs()) {
    float* p = params_.data() + s.offset;
    const bool is_norm = s.name.find("norm") != std::string::npos;
    if (s.shape.size() == 1) {
      std::fill(p, p + s.numel, is_norm && s.name.back() == 'w' ? 1.0f : 0.0f);
      continue;
    }
    const bool residual_out = s.name.find("attn.proj.w") != std::string::npos ||
                              s.name.find("mlp.proj.w") != std::string::npos;
    std::normal_distribution<float> dist(0.0f, residual_out ? std_proj : float(cfg_.init_std));
    for (int64_t i = 0; i < s.numel; i++) p[i] = dist(rng);
  }
}

// Memory-bound (500 MB for GPT-2 124M): split over the OpenMP team so every core's
// share of the memory bandwidth is used, in fixed chunks.
void Model::zero_grads() {
  const int64_t n = static_cast<int64_t>(grads_.size()), chunk = int64_t(1) << 20;
  float* g = grads_.data();
#pragma omp parallel for schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += chunk) std::memset(g + i0, 0, sizeof(float) * std::min(chunk, n - i0));
}

void Model::check_shape(int64_t B, int64_t T) const {
  LOOM_CHECK(B > 0 && B <= max_batch_ && T > 0 && T <= max_seq_, "batch shape (", B, ", ", T,
             ") exceeds the buffers this model was built for (", max_batch_, ", ", max_seq_, ")");
}

void Model::forward_block(int l, int64_t B, int64_t T) {
  const Acts& a = *acts_;
  const Acts::Block& s = a.blocks[l];
  const BlockView& w = pv_.blocks[l];
  const float* x0 = l == 0 ? a.embed : a.blocks[l - 1].out;
  const int64_t N = B * T, C = cfg_.d_model, H = cfg_.heads, KV = cfg_.kv_heads, hd = cfg_.head_dim();
  const int64_t Q = (H + 2 * KV) * hd, F = cfg_.ffn;
  const float eps = float(cfg_.norm_eps);
  const bool gpt = cfg_.arch == Arch::kGpt;
  if (gpt) k_.layernorm_forward(s.norm1, s.norm1_mean, s.norm1_rstd, x0, w.norm1_w, w.norm1_b, N, C, eps);
  else k_.rmsnorm_forward(s.norm1, s.norm1_rstd, x0, w.norm1_w, N, C, eps);
  k_.matmul_forward(s.qkv, s.norm1, w.qkv_w, w.qkv_b, N, C, Q);  // (N,Q)
  if (!gpt) k_.rope_forward(s.qkv, B, T, H, KV, hd, float(cfg_.rope_theta));
  k_.attention_forward(s.atty, s.probs, s.qkv, B, T, H, KV, hd);  // (N,H*hd)
  // x1 = x0 + atty Wo^T (+ bo): the projection lands in x1, then the residual is added.
  k_.matmul_forward(s.x1, s.atty, w.attn_proj_w, w.attn_proj_b, N, H * hd, C);
  k_.residual_forward(s.x1, s.x1, x0, N * C);
  if (gpt) {
    k_.layernorm_forward(s.norm2, s.norm2_mean, s.norm2_rstd, s.x1, w.norm2_w, w.norm2_b, N, C, eps);
    k_.matmul_forward(s.fch, s.norm2, w.fc_w, w.fc_b, N, C, F);
    k_.gelu_forward(s.fcg, s.fch, N * F);
  } else {
    k_.rmsnorm_forward(s.norm2, s.norm2_rstd, s.x1, w.norm2_w, N, C, eps);
    k_.matmul_forward(s.fch, s.norm2, w.fc_w, nullptr, N, C, 2 * F);  // [gate | up]
    k_.swiglu_forward(s.fcg, s.fch, N, F);
  }
  k_.matmul_forward(s.out, s.fcg, w.mlp_proj_w, w.mlp_proj_b, N, F, C);
  k_.residual_forward(s.out, s.out, s.x1, N * C);
}

// On entry a.dres = dL/d(block output); on exit a.dres = dL/d(block input).
void Model::backward_block(int l, int64_t B, int64_t T) {
  const Acts& a = *acts_;
  const Acts::Block& s = a.blocks[l];
  const BlockView& w = pv_.blocks[l];
  const BlockView& g = gv_.blocks[l];
  const float* x0 = l == 0 ? a.embed : a.blocks[l - 1].out;
  const int64_t N = B * T, C = cfg_.d_model, H = cfg_.heads, KV = cfg_.kv_heads, hd = cfg_.head_dim();
  const int64_t Q = (H + 2 * KV) * hd, F = cfg_.ffn;
  const bool gpt = cfg_.arch == Arch::kGpt;
  const int64_t F2 = gpt ? F : 2 * F;
  auto zero = [](float* p, int64_t n) { std::memset(p, 0, size_t(n) * sizeof(float)); };

  // MLP: out = x1 + fcg Wp^T + bp
  zero(a.dfcg, N * F);
  k_.matmul_backward(a.dfcg, g.mlp_proj_w, g.mlp_proj_b, a.dres, s.fcg, w.mlp_proj_w, N, F, C);
  zero(a.dfch, N * F2);
  if (gpt) k_.gelu_backward(a.dfch, s.fch, a.dfcg, N * F);
  else k_.swiglu_backward(a.dfch, s.fch, a.dfcg, N, F);
  zero(a.dnorm, N * C);
  k_.matmul_backward(a.dnorm, g.fc_w, g.fc_b, a.dfch, s.norm2, w.fc_w, N, C, F2);
  if (gpt)
    k_.layernorm_backward(a.dres, g.norm2_w, g.norm2_b, a.dnorm, s.x1, w.norm2_w, s.norm2_mean, s.norm2_rstd, N, C);
  else
    k_.rmsnorm_backward(a.dres, g.norm2_w, a.dnorm, s.x1, w.norm2_w, s.norm2_rstd, N, C);
  // Attention: x1 = x0 + atty Wo^T + bo
  zero(a.datty, N * H * hd);
  k_.matmul_backward(a.datty, g.attn_proj_w, g.attn_proj_b, a.dres, s.atty, w.attn_proj_w, N, H * hd, C);
  zero(a.dqkv, N * Q);
  k_.attention_backward(a.dqkv, a.datty, s.qkv, s.probs, B, T, H, KV, hd);
  if (!gpt) k_.rope_backward(a.dqkv, B, T, H, KV, hd, float(cfg_.rope_theta));
  zero(a.dnorm, N * C);
  k_.matmul_backward(a.dnorm, g.qkv_w, g.qkv_b, a.dqkv, s.norm1, w.qkv_w, N, C, Q);
  if (gpt)
    k_.layernorm_backward(a.dres, g.norm1_w, g.norm1_b, a.dnorm, x0, w.norm1_w, s.norm1_mean, s.norm1_rstd, N, C);
  else
    k_.rmsnorm_backward(a.dres, g.norm1_w, a.dnorm, x0, w.norm1_w, s.norm1_rstd, N, C);
}

namespace {
// Throws naming the first id outside [0, vocab).
void check_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what) {
  for (int64_t i = 0; i < n; i++)
    LOOM_CHECK(ids[i] >= 0 && ids[i] < vocab, what, " id ", ids[i], " at position ", i,
               " is outside the vocabulary [0, ", vocab, ")");
}

}  // namespace

void Model::forward_body(const int32_t* tokens, int64_t B, int64_t T) {
  check_shape(B, T);
  const int64_t N = B * T, C = cfg_.d_model, V = cfg_.vocab;
  check_ids(tokens, N, V, "token");
  Acts& a = *acts_;
  k_.embedding_forward(a.embed, tokens, pv_.wte, pv_.wpe, B, T, C);
  for (int l = 0; l < int(cfg_.layers); l++) forward_block(l, B, T);
  const float* xl = cfg_.layers > 0 ? a.blocks.back().out : a.embed;
  if (cfg_.arch == Arch::kGpt)
    k_.layernorm_forward(a.normf, a.normf_mean, a.normf_rstd, xl, pv_.normf_w, pv_.normf_b, N, C,
                         float(cfg_.norm_eps));
  else
    k_.rmsnorm_forward(a.normf, a.normf_rstd, xl, pv_.normf_w, N, C, float(cfg_.norm_eps));
}

void Model::backward_body(const int32_t* tokens, int64_t B, int64_t T) {
  Acts& a = *acts_;
  const int64_t N = B * T, C = cfg_.d_model;
  const float* xl = cfg_.layers > 0 ? a.blocks.back().out : a.embed;
  // a.dnorm holds dL/d(normf output); turn it into dL/d(x_L) in a.dres.
  std::memset(a.dres, 0, size_t(N * C) * sizeof(float));
  if (cfg_.arch == Arch::kGpt)
    k_.layernorm_backward(a.dres, gv_.normf_w, gv_.normf_b, a.dnorm, xl, pv_.normf_w, a.normf_mean,
                          a.normf_rstd, N, C);
  else
    k_.rmsnorm_backward(a.dres, gv_.normf_w, a.dnorm, xl, pv_.normf_w, a.normf_rstd, N, C);
  // Layout order is embeddings, blocks, normf, head: the head (own tensor for Llama) and
  // normf are final here, each block after its backward, the embeddings (and GPT's tied
  // head, which is wte) at the end.
  if (grad_ready_) grad_ready_(normf_tensor_);
  for (int l = int(cfg_.layers) - 1; l >= 0; l--) {
    backward_block(l, B, T);
    if (grad_ready_) grad_ready_(block_first_tensor_[l]);
  }
  k_.embedding_backward(gv_.wte, gv_.wpe, a.dres, tokens, B, T, C);
  if (grad_ready_) grad_ready_(0);
}

namespace {
float mean_of(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += x[i];
  return float(s / double(n));
}
}  // namespace

float Model::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                              float grad_scale) {
  forward_body(tokens, B, T);
  Acts& a = *acts_;
  const int64_t N = B * T, C = cfg_.d_model, V = cfg_.vocab;
  check_ids(targets, N, V, "target");
  std::memset(a.dnorm, 0, size_t(N * C) * sizeof(float));
  k_.lm_head_loss(a.losses, a.dnorm, gv_.head_w, a.normf, pv_.head_w, targets, N, C, V,
                  grad_scale / float(N));
  backward_body(tokens, B, T);
  return mean_of(a.losses, N);
}

float Model::forward_loss(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  forward_body(tokens, B, T);
  Acts& a = *acts_;
  const int64_t N = B * T;
  check_ids(targets, N, cfg_.vocab, "target");
  k_.lm_head_loss(a.losses, nullptr, nullptr, a.normf, pv_.head_w, targets, N, cfg_.d_model, cfg_.vocab, 0.0f);
  return mean_of(a.losses, N);
}

void Model::forward_logits(const int32_t* tokens, int64_t B, int64_t T, std::vector<float>& logits) {
  forward_body(tokens, B, T);
  const int64_t N = B * T;
  logits.resize(size_t(N * cfg_.vocab));
  k_.matmul_forward(logits.data(), acts_->normf, pv_.head_w, nullptr, N, cfg_.d_model, cfg_.vocab);
}

void Model::forward_last_logits(const int32_t* tokens, int64_t T, float* logits) {
  forward_body(tokens, 1, T);
  k_.lm_head_logits_row(logits, acts_->normf + (T - 1) * cfg_.d_model, pv_.head_w, cfg_.d_model, cfg_.vocab);
}

}  // namespace loom
