// Adasum by vector halving, distance doubling: Note [Adasum] in compress.h.
#include <algorithm>

#include "loom/core/error.h"
#include "loom/parallel/compress.h"

namespace loom::parallel {

namespace {

// Per tensor (a run of the bucket) the three sums Adasum needs: a.b, |a|^2, |b|^2.
struct Triple {
  double dot = 0, aa = 0, bb = 0;
};

// The halving at distance d: of a piece, the lower rank of a pair (rank < rank ^ d) keeps
// the first half, the upper the second; `kept` false gives the half sent away.
FlatRange half_of(FlatRange p, bool lower, bool kept = true) {
  const FlatRange first{p.offset, p.count / 2}, second{p.offset + first.count, p.count - first.count};
  return lower == kept ? first : second;
}

class Adasum final : public BucketCompressor {
 public:
  static constexpr int kTag = 0x2164;  // the halving exchange's point-to-point tag (tags < 16384)

  Adasum(const Bucket& bucket, const std::vector<ParamSpec>& specs) : count_(bucket.count) {
    for (int t = bucket.first_tensor; t <= bucket.last_tensor; t++)
      tensors_.push_back({specs[size_t(t)].offset - bucket.offset, specs[size_t(t)].numel});
  }

  void reduce(comm::Group& dp, std::span<float> g, int64_t) override {
    const int P = dp.size(), me = dp.group_rank();
    LOOM_CHECK(P >= 1 && (P & (P - 1)) == 0, "Adasum needs a power-of-two dp group; ", dp.name(), " has ", P);
    LOOM_ASSERT(int64_t(g.size()) == count_);
    FlatRange piece{0, count_};  // what this rank holds of the current tree node's vectors
    std::vector<float> theirs;
    for (int d = 1; d < P; d *= 2) {
      const int partner = me ^ d;
      const bool lower = me < partner;  // the lower rank's data is a and keeps the first half
      const FlatRange keep = half_of(piece, lower), give = half_of(piece, lower, false);
      theirs.resize(size_t(keep.count));
      dp.batch({comm::isend_op(std::span<const float>(g.data() + give.offset, size_t(give.count)), partner, kTag),
                comm::irecv_op(std::span<float>(theirs), partner, kTag)});
      combine(dp, d, lower, keep, g, theirs);
      piece = keep;
    }
    assemble(dp, g);
  }

 private:
  // The tree node at distance d: a = the lower half-group's result, b = the upper's. This
  // rank combines its `keep` range of both with the coefficients of every tensor, summed
  // over the 2d ranks holding the node's pieces.
  void combine(comm::Group& dp, int d, bool lower, FlatRange keep, std::span<float> g, const std::vector<float>& theirs) {
    const int P = dp.size(), T = int(tensors_.size());
    std::vector<double> mine(size_t(3 * T), 0.0), all(size_t(3 * T * P));
    for_each_run(keep, [&](int t, int64_t at, int64_t n) {
      Triple s;
      for (int64_t i = at; i < at + n; i++) {
        const double x = g[size_t(i)], y = theirs[size_t(i - keep.offset)];
        const double a = lower ? x : y, b = lower ? y : x;
        s.dot += a * b, s.aa += a * a, s.bb += b * b;
      }
      mine[size_t(3 * t)] = s.dot, mine[size_t(3 * t + 1)] = s.aa, mine[size_t(3 * t + 2)] = s.bb;
    });
    dp.all_gather(std::span<const double>(mine), std::span<double>(all));
    const int base = dp.group_rank() & ~(2 * d - 1);
    for_each_run(keep, [&](int t, int64_t at, int64_t n) {
      Triple s;  // summed in rank order: the same on every rank of the node
      for (int r = base; r < base + 2 * d; r++) {
        const double* v = all.data() + size_t(r) * size_t(3 * T) + size_t(3 * t);
        s.dot += v[0], s.aa += v[1], s.bb += v[2];
      }
      // A zero vector contributes nothing whatever its coefficient, so 1 stands in.
      const double ca = s.aa > 0 ? 1.0 - s.dot / (2.0 * s.aa) : 1.0, cb = s.bb > 0 ? 1.0 - s.dot / (2.0 * s.bb) : 1.0;
      for (int64_t i = at; i < at + n; i++) {
        const double x = g[size_t(i)], y = theirs[size_t(i - keep.offset)];
        g[size_t(i)] = float(lower ? ca * x + cb * y : ca * y + cb * x);
      }
    });
    // Padding between tensors (zero in both) stays zero.
  }

  // fn(tensor, first, count) for every tensor's intersection with `r`.
  template <typename Fn>
  void for_each_run(FlatRange r, Fn&& fn) const {
    for (int t = 0; t < int(tensors_.size()); t++) {
      const int64_t lo = std::max(r.offset, tensors_[size_t(t)].offset);
      const int64_t hi = std::min(r.offset + r.count, tensors_[size_t(t)].offset + tensors_[size_t(t)].count);
      if (hi > lo) fn(t, lo, hi - lo);
    }
  }

  // Rank r ends holding the piece the halving left it (a pure function of r); one
  // all-gather of pieces padded to the longest brings every piece to every rank.
  void assemble(comm::Group& dp, std::span<float> g) const {
    const int P = dp.size();
    if (P == 1) return;
    std::vector<FlatRange> pieces;
    int64_t longest = 0;
    for (int r = 0; r < P; r++) {
      FlatRange p{0, count_};
      for (int d = 1; d < P; d *= 2) p = half_of(p, r < (r ^ d));
      pieces.push_back(p);
      longest = std::max(longest, p.count);
    }
    const FlatRange mine = pieces[size_t(dp.group_rank())];
    std::vector<float> block(size_t(longest), 0.0f), all(size_t(longest * P));
    std::copy_n(g.begin() + mine.offset, mine.count, block.begin());
    dp.all_gather(std::span<const float>(block), std::span<float>(all));
    for (int r = 0; r < P; r++)
      std::copy_n(all.begin() + int64_t(r) * longest, pieces[size_t(r)].count, g.begin() + pieces[size_t(r)].offset);
  }

  int64_t count_;
  std::vector<FlatRange> tensors_;  // offsets relative to the bucket
};

}  // namespace

std::unique_ptr<BucketCompressor> make_adasum(const Bucket& bucket, const std::vector<ParamSpec>& specs) {
  return std::make_unique<Adasum>(bucket, specs);
}

}  // namespace loom::parallel
