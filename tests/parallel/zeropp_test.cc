// ZeRO++ qwZ (Note [bf16 parameter gathers] in parallel/zero.h) on thread ranks: the
// gathered weights against the exact ones, with the block-quantisation bound.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "loom/comm/algorithms.h"
#include "loom/comm/world.h"
#include "loom/parallel/qgz.h"
#include "loom/parallel/zero.h"

namespace loom::parallel {
namespace {

// Every unit gathered as int8 blocks reads each weight within half a quantisation step,
// max|block| / 254, of the exact weight (blocks of comm::kQuantBlock from the start of each
// rank's piece), and every rank reads the same bits.
TEST(ZeroPP, QwzGathersWithinHalfAQuantisationStep) {
  ModelConfig m;
  apply_model_preset(m, "tiny");
  m.layers = 2;
  for (int dp : {2, 3}) {
    std::vector<int> unit_bucket;
    const DataParallelPlan plan = plan_units(m, dp, {}, &unit_bucket);
    const ParamLayout layout(m, plan.padding);
    std::vector<float> exact(size_t(layout.total_floats()));
    std::mt19937_64 rng{uint64_t(dp)};
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& x : exact) x = normal(rng);
    std::vector<std::map<int, std::vector<float>>> seen(static_cast<size_t>(dp));  // [rank][unit]
    comm::CommOptions o;
    o.timeout = std::chrono::milliseconds(20'000);
    const auto errors = comm::run_threads(dp, o, [&](comm::World& w) {
      const int r = w.global_rank();
      std::vector<float> params = exact;
      std::map<int, float*> base;
      ParamGather g(w.world_group(), plan, unit_bucket, params.data(),
                    [&](int unit, float* at) { base[unit] = at; }, nullptr, {}, comm::Compression::kInt8);
      for (int unit = 0; unit < int(unit_bucket.size()); unit++) {
        g.acquire(unit);
        const Bucket& b = plan.buckets[size_t(unit_bucket[size_t(unit)])];
        seen[size_t(r)][unit].assign(base[unit], base[unit] + b.count);
        g.release(unit);
      }
    });
    for (const std::string& e : errors) ASSERT_EQ(e, "");
    for (int unit = 0; unit < int(unit_bucket.size()); unit++) {
      const Bucket& b = plan.buckets[size_t(unit_bucket[size_t(unit)])];
      const std::vector<float>& got = seen[0][unit];
      for (int r = 1; r < dp; r++) ASSERT_EQ(seen[size_t(r)][unit], got) << "rank " << r << " unit " << unit;
      const int64_t piece = b.count / dp, block = int64_t(comm::kQuantBlock);
      bool rounded = false;
      for (int64_t lo = 0; lo < b.count; lo += std::min(block, piece - lo % piece)) {
        const int64_t hi = std::min(lo + block, (lo / piece + 1) * piece);
        float amax = 0;
        for (int64_t i = lo; i < hi; i++) amax = std::max(amax, std::fabs(exact[size_t(b.offset + i)]));
        for (int64_t i = lo; i < hi; i++) {
          const float want = exact[size_t(b.offset + i)];
          ASSERT_LE(std::fabs(got[size_t(i)] - want), amax / 254 * (1 + 1e-5)) << "unit " << unit << " at " << i;
          rounded |= got[size_t(i)] != want;
        }
      }
      EXPECT_TRUE(rounded) << "unit " << unit << " was gathered exactly: qwZ did not run";
    }
  }
}

// Note [qgZ]: the own piece is the exact sum plus, per other rank, at most half that rank's
// quantisation step (max|block| / 254) per value; the mean scale applies after; a NaN on
// one rank reaches the piece's owner; every rank sends (dp - 1) int8 pieces with scales.
TEST(ZeroPP, QgzReduceScatterWithinTheOtherRanksQuantisationSteps) {
  for (int dp : {2, 3, 4}) {
    const size_t piece = 700, n = piece * size_t(dp);  // pieces of 2 full blocks and a partial one
    auto input = [&](int r) {
      std::vector<float> x(n);
      std::mt19937_64 rng(uint64_t(100 + r));
      std::normal_distribution<float> normal(0.0f, 1.0f + float(r));
      for (float& v : x) v = normal(rng);
      return x;
    };
    std::vector<std::vector<float>> own(static_cast<size_t>(dp));
    comm::CommOptions o;
    o.timeout = std::chrono::milliseconds(20'000);
    const auto errors = comm::run_threads(dp, o, [&](comm::World& w) {
      const int r = w.global_rank();
      std::vector<float> all = input(r);
      QgzScatter q(w.world_group(), all);
      q.take_work().wait();
      std::span<float> mine(all.data() + size_t(r) * piece, piece);
      q.complete(mine, 0.5f);
      own[size_t(r)].assign(mine.begin(), mine.end());
    });
    for (const std::string& e : errors) ASSERT_EQ(e, "");
    EXPECT_NEAR(QgzScatter::wire_bytes(int64_t(n), dp), double(dp - 1) * (700 + 4 * 3), 1e-9);
    for (int j = 0; j < dp; j++) {
      bool rounded = false;
      for (size_t i = 0; i < piece; i++) {
        const size_t at = size_t(j) * piece + i, lo = size_t(j) * piece + i / 256 * 256;
        const size_t hi = std::min(lo + 256, size_t(j + 1) * piece);
        double exact = 0, bound = 0;
        for (int r = 0; r < dp; r++) {
          const std::vector<float> x = input(r);
          exact += x[at];
          if (r == j) continue;
          float amax = 0;
          for (size_t k = lo; k < hi; k++) amax = std::max(amax, std::fabs(x[k]));
          bound += amax / 254.0;
        }
        const double got = own[size_t(j)][i] / 0.5;
        ASSERT_LE(std::fabs(got - exact), bound * (1 + 1e-5) + 1e-5) << dp << " ranks, piece " << j << " at " << i;
        rounded |= std::fabs(got - exact) > 1e-5;
      }
      EXPECT_TRUE(rounded) << "piece " << j << " came out exact: nothing was quantised";
    }
  }
}

TEST(ZeroPP, QgzCarriesANonFiniteValueToThePieceOwner) {
  std::vector<std::vector<float>> own(2);
  comm::CommOptions o;
  o.timeout = std::chrono::milliseconds(20'000);
  const auto errors = comm::run_threads(2, o, [&](comm::World& w) {
    const int r = w.global_rank();
    std::vector<float> all(64, 1.0f);
    if (r == 1) all[3] = INFINITY;  // in rank 0's piece
    QgzScatter q(w.world_group(), all);
    q.take_work().wait();
    std::span<float> mine(all.data() + size_t(r) * 32, 32);
    q.complete(mine, 1.0f);
    own[size_t(r)].assign(mine.begin(), mine.end());
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  EXPECT_TRUE(std::isnan(own[0][3]));
  EXPECT_EQ(own[1], std::vector<float>(32, 2.0f));
}

}  // namespace
}  // namespace loom::parallel
