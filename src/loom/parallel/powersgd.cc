// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019), Algorithm 1 with error feedback and
// warm start; Note [Gradient compressors] in compress.h.
#include <cblas.h>

#include <cmath>
#include <random>

#include "loom/core/error.h"
#include "loom/parallel/compress.h"

namespace loom::parallel {

namespace {

// One matrix of the bucket, (rows, cols) row-major at `offset` (relative to the bucket).
struct Matrix {
  int64_t offset = 0, rows = 0, cols = 0;
  int64_t p_at = 0, q_at = 0;  // into p_ (rows x r) and q_ (cols x r), row-major
};

// Columns of P (rows x r, row-major) made orthonormal by Gram-Schmidt in fp64, in order,
// projecting twice ("twice is enough", Giraud et al. 2005). A column left with less than
// 1e-6 of its norm lies in the span of the earlier ones (a gradient of lower rank than
// r); normalising that rounding noise would give an arbitrary, non-orthogonal direction,
// so it becomes zero and adds nothing to P Q^T. Deterministic, so every rank, holding the
// same all-reduced P, gets the same bits.
double column_norm(const float* P, int64_t rows, int64_t r, int64_t j) {
  double norm = 0;
  for (int64_t k = 0; k < rows; k++) norm += double(P[k * r + j]) * P[k * r + j];
  return std::sqrt(norm);
}

void orthonormalise(float* P, int64_t rows, int64_t r) {
  for (int64_t j = 0; j < r; j++) {
    const double before = column_norm(P, rows, r, j);
    for (int pass = 0; pass < 2; pass++)
      for (int64_t i = 0; i < j; i++) {
        double dot = 0;
        for (int64_t k = 0; k < rows; k++) dot += double(P[k * r + i]) * P[k * r + j];
        for (int64_t k = 0; k < rows; k++) P[k * r + j] -= float(dot) * P[k * r + i];
      }
    const double norm = column_norm(P, rows, r, j);
    const float inv = norm > 1e-6 * before && norm > 0 ? float(1.0 / norm) : 0.0f;
    for (int64_t k = 0; k < rows; k++) P[k * r + j] *= inv;
  }
}

class PowerSgd final : public BucketCompressor {
 public:
  PowerSgd(const CompressSpec& spec, const Bucket& bucket, int index, const std::vector<ParamSpec>& specs)
      : r_(spec.rank), count_(bucket.count) {
    LOOM_CHECK(r_ >= 1, "parallel.compress_rank = ", r_, ": PowerSGD needs a rank >= 1");
    for (int t = bucket.first_tensor; t <= bucket.last_tensor; t++) {
      const ParamSpec& s = specs[size_t(t)];
      const int64_t at = s.offset - bucket.offset;
      if (powersgd_compresses(s, r_)) {
        matrices_.push_back({at, s.shape[0], s.shape[1], p_count_, q_count_});
        p_count_ += s.shape[0] * r_;
        q_count_ += s.shape[1] * r_;
      } else {
        dense_.push_back({at, s.numel});
        dense_count_ += s.numel;
      }
    }
    e_.assign(size_t(count_), 0.0f);
    // Q0 ~ N(0, 1), the same on every rank: seeded by (seed, bucket), not by rank.
    std::mt19937_64 rng(spec.seed ^ (uint64_t(index) * 0x9e3779b97f4a7c15ull));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q_.resize(size_t(q_count_));
    for (float& x : q_) x = normal(rng);
  }

  void reduce(comm::Group& dp, std::span<float> g, int64_t) override {
    LOOM_ASSERT(int64_t(g.size()) == count_);
    std::vector<float> p(static_cast<size_t>(p_count_)), dense(static_cast<size_t>(dense_count_));
    for (const Matrix& m : matrices_) {  // e <- M = G + E; P = M Q
      float* M = e_.data() + m.offset;
      for (int64_t i = 0; i < m.rows * m.cols; i++) M[i] += g[size_t(m.offset + i)];
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m.rows), int(r_), int(m.cols), 1.0f, M,
                  int(m.cols), q_.data() + m.q_at, int(r_), 0.0f, p.data() + m.p_at, int(r_));
    }
    int64_t at = 0;
    for (const FlatRange& d : dense_)
      for (int64_t i = 0; i < d.count; i++) dense[size_t(at++)] = g[size_t(d.offset + i)];
    if (p_count_) dp.all_reduce(std::span<float>(p), comm::ReduceOp::kAvg);
    for (const Matrix& m : matrices_) {  // Q = M^T P_hat
      orthonormalise(p.data() + m.p_at, m.rows, r_);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(m.cols), int(r_), int(m.rows), 1.0f,
                  e_.data() + m.offset, int(m.cols), p.data() + m.p_at, int(r_), 0.0f, q_.data() + m.q_at, int(r_));
    }
    if (q_count_) dp.all_reduce(std::span<float>(q_), comm::ReduceOp::kAvg);
    if (dense_count_) dp.all_reduce(std::span<float>(dense), comm::ReduceOp::kAvg);
    std::fill(g.begin(), g.end(), 0.0f);  // padding between tensors stays zero
    for (const Matrix& m : matrices_) {  // G' = P_hat Q^T; E = M - G'
      float* out = g.data() + m.offset;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m.rows), int(m.cols), int(r_), 1.0f,
                  p.data() + m.p_at, int(r_), q_.data() + m.q_at, int(r_), 0.0f, out, int(m.cols));
      float* M = e_.data() + m.offset;
      for (int64_t i = 0; i < m.rows * m.cols; i++) M[i] -= out[i];
    }
    at = 0;
    for (const FlatRange& d : dense_)
      for (int64_t i = 0; i < d.count; i++) g[size_t(d.offset + i)] = dense[size_t(at++)];
  }

  std::vector<CompressorState> state() override { return {{"residual", &e_}, {"q", &q_}}; }

 private:
  int64_t r_, count_;
  std::vector<Matrix> matrices_;
  std::vector<FlatRange> dense_;  // vectors and small matrices: exact all-reduce
  int64_t p_count_ = 0, q_count_ = 0, dense_count_ = 0;
  std::vector<float> e_, q_;  // residual (bucket-sized; zero outside matrices), warm-started Q
};

}  // namespace

std::unique_ptr<BucketCompressor> make_powersgd(const CompressSpec& spec, const Bucket& bucket, int index,
                                                const std::vector<ParamSpec>& specs) {
  return std::make_unique<PowerSgd>(spec, bucket, index, specs);
}

}  // namespace loom::parallel
