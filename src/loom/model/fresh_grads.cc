// Note [Fresh gradients] (model.h): zero_grads, and the linears whose first backward
// writes its gradients instead of adding them to zeros.
#include <algorithm>
#include <cstring>

#include "loom/model/model.h"

namespace loom {

namespace {

constexpr int64_t kZeroPiece = int64_t(1) << 20;  // floats per memset task

// The four linears of a block in the order backward_block reaches them.
constexpr const char* kLinears[Model::kLinearsPerBlock] = {"mlp.proj", "mlp.fc", "attn.proj", "attn.qkv"};

}  // namespace

// Each held linear's weight and bias ranges, and the rest of the buffer (what zero_grads
// memsets) cut into kZeroPiece pieces so the team shares the bandwidth.
void Model::index_fresh() {
  fresh_linears_.assign(size_t(cfg_.layers) * kLinearsPerBlock, FreshLinear{});
  fresh_.assign(fresh_linears_.size(), 0);
  std::vector<FlatRange> skip;
  for (int l = 0; l < int(cfg_.layers); l++)
    for (int j = 0; j < kLinearsPerBlock; j++) {
      const std::string p = "h." + std::to_string(l) + "." + kLinears[j];
      FreshLinear& f = fresh_linears_[size_t(l * kLinearsPerBlock + j)];
      if (const ParamSpec* w = layout_.find(p + ".w")) f.w = {w->offset, w->numel}, skip.push_back(f.w);
      if (const ParamSpec* b = layout_.find(p + ".b")) f.b = {b->offset, b->numel}, skip.push_back(f.b);
    }
  std::sort(skip.begin(), skip.end(), [](const FlatRange& a, const FlatRange& b) { return a.offset < b.offset; });
  zero_pieces_.clear();
  auto add = [&](int64_t from, int64_t to) {
    for (int64_t at = from; at < to; at += kZeroPiece) zero_pieces_.push_back({at, std::min(kZeroPiece, to - at)});
  };
  int64_t at = 0;
  for (const FlatRange& r : skip) add(at, r.offset), at = r.offset + r.count;
  add(at, int64_t(grads_.size()));
}

void Model::zero_grads() {
  const int64_t n = int64_t(zero_pieces_.size());
  float* g = grads_.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const FlatRange& r = zero_pieces_[size_t(i)];
    std::memset(g + r.offset, 0, sizeof(float) * size_t(r.count));
  }
  for (size_t i = 0; i < fresh_.size(); i++) fresh_[i] = fresh_linears_[i].w.count > 0;
  fresh_any_ = true;
}

bool Model::take_fresh(int l, int j) {
  uint8_t& f = fresh_[size_t(l * kLinearsPerBlock + j)];
  const bool was = f != 0;
  f = 0;
  return was;
}

void Model::settle_fresh(int first, int end) {
  if (!fresh_any_) return;
  for (int l = first; l < end; l++)
    for (int j = 0; j < kLinearsPerBlock; j++) {
      if (!take_fresh(l, j)) continue;
      const FreshLinear& f = fresh_linears_[size_t(l * kLinearsPerBlock + j)];
      std::memset(grads_.data() + f.w.offset, 0, sizeof(float) * f.w.count);
      if (f.b.count) std::memset(grads_.data() + f.b.offset, 0, sizeof(float) * f.b.count);
    }
  if (first == 0 && end == int(cfg_.layers)) fresh_any_ = false;
}

}  // namespace loom
