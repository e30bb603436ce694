// Model-private: the activation storage Model carves (model.cc) and the backward pass
// (backward.cc) read. Nothing outside src/loom/model includes this.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loom/model/model.h"

namespace loom {

// Throws naming the first id outside [0, vocab) (`what`: "token" or "target").
void check_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what);

// Saved activations of one chunk for one micro-batch in flight, and the shared backward
// scratch, carved from one allocation. N = B*T rows; Q = (H + 2 KV) * hd; F2 = F (GPT)
// or 2F (Llama gate|up).
struct Model::Slot {
  struct Block {
    float *norm1, *norm1_mean, *norm1_rstd;  // (N,C), (N), (N)
    float* qkv;                              // (N,Q), after RoPE for Llama
    float* probs;                            // (B,H,T,T); nullptr when kept in bf16 (probs_h)
    float* atty;                             // (N,H*hd)
    float* x1;                               // (N,C) residual after attention
    float *norm2, *norm2_mean, *norm2_rstd;
    float* fch;                              // (N,F2) fc output, pre-activation
    float* fcg;                              // (N,F) activation output
    float* out;                              // (N,C) block output = next block's input
    // Note [bf16 activation storage]: with bf16 storage these are the saved copies of
    // norm1, atty, norm2 and fcg, whose float fields then point at Acts::stage, and of qkv
    // and fch, whose float fields point at Acts::stage2.
    bf16 *norm1_h = nullptr, *atty_h = nullptr, *norm2_h = nullptr, *fcg_h = nullptr;
    bf16 *qkv_h = nullptr, *fch_h = nullptr;
    bf16* probs_h = nullptr;  // Note [bf16 attention probabilities]: P kept in bf16
  };
  float* input = nullptr;        // (N,C) chunk input: the embedding output or a copy of x_in
  std::vector<Block> blocks;     // the chunk's layers, in order
  int32_t* tokens = nullptr;     // (N) embedding chunk: the tokens, for embedding backward
  float *normf = nullptr, *normf_mean = nullptr, *normf_rstd = nullptr;  // head chunk
  float* dnormf = nullptr;       // (N,C) head chunk: dL/d(normf output), made in forward
  float* dinput = nullptr;       // (N,C) dL/d(input), for the previous stage
  std::vector<int32_t> doc_start;  // (N) document-causal mask: each position's document start; empty when off
};

// Note [B/W split] (model.h): one layer's upstream gradients of its linear layers, kept
// from B to W; all N rows under sequence parallel.
struct Model::WBlock {
  float* dproj;  // (N,C) dL/d(MLP projection output)
  float* dfch;   // (N,F2) dL/d(fc output)
  float* dattn;  // (N,C) dL/d(attention projection output)
  float* dqkv;   // (N,Q) dL/d(qkv GEMM output) (RoPE's backward applied)
};

struct Model::WSlot {
  std::vector<WBlock> blocks;  // the chunk's layers, in order
};

struct Model::Acts {
  std::unique_ptr<float[]> storage;
  int64_t floats = 0;
  std::vector<Slot> slots;  // [chunk * act_slots + slot]
  std::vector<WSlot> wslots;  // [chunk * w_slots + w]
  float* losses = nullptr;  // (N)
  float *dres, *dnorm, *datty, *dqkv, *dfch, *dfcg;  // backward scratch
  float* full_tmp = nullptr;  // (N,C) sequence parallel: partial outputs, gathered gradients
  float* norm_grad_tmp = nullptr;  // (2C) sequence parallel: one micro-batch's norm gradients
  // bf16 storage: (N, max(C, H*hd, F)), where a GEMM input is made before it is kept; dfcg in backward
  float* stage = nullptr;
  // bf16 storage: (N, max(Q, F2)), qkv / fch made in forward; dfch, then the widened qkv, in backward
  float* stage2 = nullptr;
  // Note [Lean residual stream]: with bf16 storage, x1 of every block and the outputs of the
  // blocks that keep none, all (Nr,C).
  float* res_x1 = nullptr;
  float* res_out[2] = {nullptr, nullptr};
  // Recompute (Note [Recompute]): the block all fully recomputed layers share, and the
  // softmax probabilities all selectively recomputed layers share.
  Slot::Block recompute_block{};
  float* shared_probs = nullptr;
  bf16* shared_probs_h = nullptr;  // the same, kept in bf16
};

}  // namespace loom
