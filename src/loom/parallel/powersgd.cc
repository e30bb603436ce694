// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019), Algorithm 1 with error feedback and
// warm start; Note [Gradient compressors] in compress.h.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "loom/core/error.h"
#include "loom/parallel/compress.h"

namespace loom::parallel {

namespace {

// One matrix of the bucket, (rows, cols) row-major at `offset` (relative to the bucket),
// compressed at the smaller of the two ranks; its Q has a slot of cols x r_max at q_at
// (row stride r_max; the current rank uses the first r columns).
struct Matrix {
  int64_t offset = 0, rows = 0, cols = 0, q_at = 0;
  int64_t numel() const { return rows * cols; }
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

// Under Accordion (Note [Accordion]) the rank switches between the light and the heavy
// setting; the residual carries over, a matrix that would not shrink at the current rank
// goes exact (its residual with it), and Q keeps a slot for the larger rank so that its
// columns stay warm across switches.
class PowerSgd final : public BucketCompressor {
 public:
  PowerSgd(const CompressSpec& spec, const Bucket& bucket, uint64_t key, const std::vector<ParamSpec>& specs)
      : light_(spec.rank), heavy_(spec.accordion ? spec.heavy_rank : spec.rank), r_(light_),
        r_max_(std::max(light_, heavy_)), count_(bucket.count) {
    LOOM_CHECK(light_ >= 1 && heavy_ >= 1, "parallel.compress_rank = ", light_, ": PowerSGD needs a rank >= 1");
    const int64_t r_min = std::min(light_, heavy_);
    for (int t = bucket.first_tensor; t <= bucket.last_tensor; t++) {
      const ParamSpec& s = specs[size_t(t)];
      const int64_t at = s.offset - bucket.offset;
      if (powersgd_compresses(s, r_min)) {
        matrices_.push_back({at, s.shape[0], s.shape[1], q_count_});
        q_count_ += s.shape[1] * r_max_;
      } else {
        dense_.push_back({at, s.numel});
      }
    }
    e_.assign(size_t(count_), 0.0f);
    // Q0 ~ N(0, 1), the same on every rank: seeded by (seed, bucket key), not by rank.
    std::mt19937_64 rng(spec.seed ^ (key * 0x9e3779b97f4a7c15ull));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q_.resize(size_t(q_count_));
    for (float& x : q_) x = normal(rng);
  }

  void reduce(comm::Group& dp, std::span<float> g, int64_t) override {
    LOOM_ASSERT(int64_t(g.size()) == count_);
    std::vector<const Matrix*> low;      // compressed at rank r_
    std::vector<FlatRange> exact = dense_;  // the rest, all-reduced exactly
    for (const Matrix& m : matrices_) {
      if ((m.rows + m.cols) * r_ * 2 <= m.numel()) low.push_back(&m);  // powersgd_compresses at r_
      else exact.push_back({m.offset, m.numel()});
    }
    int64_t p_count = 0, q_count = 0, exact_count = 0;
    for (const Matrix* m : low) p_count += m->rows * r_, q_count += m->cols * r_;
    for (const FlatRange& d : exact) exact_count += d.count;
    std::vector<float> p(static_cast<size_t>(p_count)), q(static_cast<size_t>(q_count)),
        dense(static_cast<size_t>(exact_count));
    int64_t at = 0;
    for (const FlatRange& d : exact)  // with any residual a matrix kept at another rank (else g as is, -0 too)
      for (int64_t i = d.offset; i < d.offset + d.count; i++)
        dense[size_t(at++)] = e_[size_t(i)] != 0.0f ? g[size_t(i)] + e_[size_t(i)] : g[size_t(i)];
    for (const FlatRange& d : exact) std::fill_n(e_.begin() + d.offset, d.count, 0.0f);
    at = 0;
    for (const Matrix* m : low) {  // e <- M = G + E; P = M Q
      float* M = e_.data() + m->offset;
      for (int64_t i = 0; i < m->numel(); i++) M[i] += g[size_t(m->offset + i)];
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m->rows), int(r_), int(m->cols), 1.0f, M,
                  int(m->cols), q_.data() + m->q_at, int(r_max_), 0.0f, p.data() + at, int(r_));
      at += m->rows * r_;
    }
    if (p_count) dp.all_reduce(std::span<float>(p), comm::ReduceOp::kAvg);
    project_q(low, p, q);
    if (q_count) dp.all_reduce(std::span<float>(q), comm::ReduceOp::kAvg);
    if (exact_count) dp.all_reduce(std::span<float>(dense), comm::ReduceOp::kAvg);
    std::fill(g.begin(), g.end(), 0.0f);  // padding between tensors stays zero
    int64_t pa = 0, qa = 0;
    for (const Matrix* m : low) {  // Q back into its slot (warm start); G' = P_hat Q^T; E = M - G'
      for (int64_t k = 0; k < m->cols; k++) std::copy_n(q.begin() + qa + k * r_, r_, q_.begin() + m->q_at + k * r_max_);
      float* out = g.data() + m->offset;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m->rows), int(m->cols), int(r_), 1.0f, p.data() + pa,
                  int(r_), q.data() + qa, int(r_), 0.0f, out, int(m->cols));
      float* M = e_.data() + m->offset;
      for (int64_t i = 0; i < m->numel(); i++) M[i] -= out[i];
      pa += m->rows * r_, qa += m->cols * r_;
    }
    at = 0;
    for (const FlatRange& d : exact)
      for (int64_t i = 0; i < d.count; i++) g[size_t(d.offset + i)] = dense[size_t(at++)];
  }

  std::vector<CompressorState> state() override { return {{"residual", &e_}, {"q", &q_}}; }

 private:
  void on_setting(bool heavy) override { r_ = heavy ? heavy_ : light_; }

  // P_hat = orthonormalised P; q = M^T P_hat, packed (cols x r_ per matrix, in order).
  void project_q(const std::vector<const Matrix*>& low, std::vector<float>& p, std::vector<float>& q) {
    int64_t pa = 0, qa = 0;
    for (const Matrix* m : low) {
      orthonormalise(p.data() + pa, m->rows, r_);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(m->cols), int(r_), int(m->rows), 1.0f,
                  e_.data() + m->offset, int(m->cols), p.data() + pa, int(r_), 0.0f, q.data() + qa, int(r_));
      pa += m->rows * r_, qa += m->cols * r_;
    }
  }

  int64_t light_, heavy_, r_, r_max_, count_;
  std::vector<Matrix> matrices_;  // compressed at the smaller rank
  std::vector<FlatRange> dense_;  // vectors and small matrices: always exact
  int64_t q_count_ = 0;
  std::vector<float> e_, q_;      // residual (bucket-sized; zero outside compressed matrices), Q slots
};

}  // namespace

std::unique_ptr<BucketCompressor> make_powersgd(const CompressSpec& spec, const Bucket& bucket, uint64_t key,
                                                const std::vector<ParamSpec>& specs) {
  return std::make_unique<PowerSgd>(spec, bucket, key, specs);
}

}  // namespace loom::parallel
