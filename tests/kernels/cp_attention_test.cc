// Context parallelism's building blocks: the chunks of a sequence per rank (Note
// [Context-parallel chunks]) and attention of a rank's rows against the gathered keys (Note
// [Context-parallel attention]): the reference equals the whole sequence's causal attention
// row for row, with and without document masks, and the ranks' key / value gradients sum to
// the whole sequence's; the fast kernel against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/bf16.h"
#include "loom/kernels/cpu/gemm_bf16.h"
#include "loom/kernels/cpu/ops.h"
#include "loom/kernels/ref/gemm_bf16.h"
#include "loom/kernels/ref/ops.h"
#include "loom/rank/cp_chunks.h"

namespace loom {
namespace {

using rank::CpSplit;

TEST(CpChunks, ZigZagGivesEachRankTwoMirroredChunksAndPlainOne) {
  EXPECT_EQ(rank::cp_positions(16, 2, 0, CpSplit::kZigZag), (std::vector<int32_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(rank::cp_positions(16, 2, 1, CpSplit::kZigZag), (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(rank::cp_positions(6, 3, 2, CpSplit::kPlain), (std::vector<int32_t>{4, 5}));
  // Every position has one owner, and each rank's causal work (sum of keys its rows see) is
  // the same under zigzag: 2n c^2 plus the diagonal, c = T / 2n.
  for (int cp : {2, 3, 4}) {
    const int64_t T = 48;
    const std::vector<rank::CpSlot> owners = rank::cp_owners(T, cp, CpSplit::kZigZag);
    std::vector<int64_t> work(size_t(cp), 0);
    for (int r = 0; r < cp; ++r) {
      const std::vector<int32_t> pos = rank::cp_positions(T, cp, r, CpSplit::kZigZag);
      ASSERT_EQ(int64_t(pos.size()), T / cp);
      ASSERT_TRUE(std::is_sorted(pos.begin(), pos.end()));
      for (size_t i = 0; i < pos.size(); ++i) {
        EXPECT_EQ(owners[size_t(pos[i])].rank, r);
        EXPECT_EQ(owners[size_t(pos[i])].index, int32_t(i));
        work[size_t(r)] += pos[i] + 1;
      }
    }
    for (int r = 1; r < cp; ++r) EXPECT_EQ(work[size_t(r)], work[0]) << "cp " << cp;
  }
  try {
    rank::cp_positions(10, 3, 0, CpSplit::kZigZag);
    FAIL() << "10 tokens split into 6 chunks";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("a multiple of 6"), std::string::npos) << e.what();
  }
}

struct Case {
  int64_t B = 2, T = 24, H = 4, KV = 2, hd = 8;
  int64_t row() const { return (H + 2 * KV) * hd; }
};

std::vector<float> normal(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Random document starts per batch row (nullptr-free: position 0 starts the first).
std::vector<int32_t> doc_starts(std::mt19937& rng, const Case& c) {
  std::vector<int32_t> s(size_t(c.B * c.T));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0, start = 0; t < c.T; ++t) {
      if (t > 0 && rng() % 5 == 0) start = t;
      s[size_t(b * c.T + t)] = int32_t(start);
    }
  return s;
}

// The largest |a - b| over the largest |b| (at least 1).
double off(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}

// Each rank's rows of the whole sequence's qkv, its doc starts, and K|V of every position.
struct Local {
  std::vector<int32_t> pos, doc;
  std::vector<float> qkv, kv;
};
Local local_of(const Case& c, const std::vector<float>& qkv, const std::vector<int32_t>* doc, const std::vector<int32_t>& pos) {
  Local l;
  l.pos = pos;
  const int64_t Tq = int64_t(pos.size()), row = c.row(), kvrow = 2 * c.KV * c.hd;
  l.qkv.resize(size_t(c.B * Tq * row));
  l.kv.resize(size_t(c.B * c.T * kvrow));
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t t = 0; t < Tq; ++t) {
      std::copy_n(qkv.begin() + (b * c.T + pos[size_t(t)]) * row, row, l.qkv.begin() + (b * Tq + t) * row);
      if (doc) l.doc.push_back((*doc)[size_t(b * c.T + pos[size_t(t)])]);
    }
    for (int64_t j = 0; j < c.T; ++j)
      std::copy_n(qkv.begin() + (b * c.T + j) * row + c.H * c.hd, kvrow, l.kv.begin() + (b * c.T + j) * kvrow);
  }
  return l;
}

// Note [Context-parallel attention]: every rank's output rows are the whole sequence's causal
// attention at its positions; its dQ rows are the whole dQ's; the ranks' dK, dV sum to the
// whole. cp 2, 3, 4, zigzag and plain, with document masks and without (the reference, in
// double sums, so only the order of float additions differs: 1e-6).
TEST(CpAttention, RanksTogetherAreTheWholeSequencesAttention) {
  std::mt19937 rng(7);
  const Case c;
  const int64_t row = c.row(), kvrow = 2 * c.KV * c.hd, C = c.H * c.hd;
  const std::vector<float> qkv = normal(rng, size_t(c.B * c.T * row)), dout = normal(rng, size_t(c.B * c.T * C));
  const std::vector<int32_t> starts = doc_starts(rng, c);
  for (const bool masked : {false, true}) {
    const int32_t* doc = masked ? starts.data() : nullptr;
    std::vector<float> out(size_t(c.B * c.T * C)), probs(size_t(c.B * c.H * c.T * c.T)), dqkv(qkv.size(), 0.0f);
    ref::attention_forward(out.data(), probs.data(), qkv.data(), c.B, c.T, c.H, c.KV, c.hd, doc);
    ref::attention_backward(dqkv.data(), dout.data(), qkv.data(), probs.data(), c.B, c.T, c.H, c.KV, c.hd);
    for (int cp : {2, 3, 4})
      for (const CpSplit split : {CpSplit::kZigZag, CpSplit::kPlain}) {
        SCOPED_TRACE("cp " + std::to_string(cp) + (split == CpSplit::kZigZag ? " zigzag" : " plain") +
                     (masked ? " masked" : ""));
        std::vector<float> dkv_sum(size_t(c.B * c.T * kvrow), 0.0f);
        for (int r = 0; r < cp; ++r) {
          const Local l = local_of(c, qkv, masked ? &starts : nullptr, rank::cp_positions(c.T, cp, r, split));
          const int64_t Tq = int64_t(l.pos.size());
          std::vector<float> o(size_t(c.B * Tq * C)), p(size_t(c.B * c.H * Tq * c.T)), dq(l.qkv.size(), 0.0f),
              dkv(l.kv.size(), 0.0f), dy(size_t(c.B * Tq * C));
          ref::cp_attention_forward(o.data(), p.data(), l.qkv.data(), l.kv.data(), l.pos.data(), c.B, Tq, c.T, c.H, c.KV,
                                    c.hd, masked ? l.doc.data() : nullptr);
          for (int64_t b = 0; b < c.B; ++b)
            for (int64_t t = 0; t < Tq; ++t) {
              const int64_t g = b * c.T + l.pos[size_t(t)];
              std::copy_n(dout.begin() + g * C, C, dy.begin() + (b * Tq + t) * C);
              for (int64_t e = 0; e < C; ++e)
                ASSERT_NEAR(o[size_t((b * Tq + t) * C + e)], out[size_t(g * C + e)], 1e-6) << "rank " << r << " row " << t;
            }
          ref::cp_attention_backward(dq.data(), dkv.data(), dy.data(), l.qkv.data(), l.kv.data(), p.data(), l.pos.data(),
                                     c.B, Tq, c.T, c.H, c.KV, c.hd);
          for (int64_t b = 0; b < c.B; ++b)
            for (int64_t t = 0; t < Tq; ++t)
              for (int64_t e = 0; e < C; ++e)  // the Q part of the row
                ASSERT_NEAR(dq[size_t((b * Tq + t) * row + e)], dqkv[size_t((b * c.T + l.pos[size_t(t)]) * row + e)], 1e-5);
          for (size_t i = 0; i < dkv.size(); ++i) dkv_sum[i] += dkv[i];
        }
        for (int64_t bj = 0; bj < c.B * c.T; ++bj)
          for (int64_t e = 0; e < kvrow; ++e)
            ASSERT_NEAR(dkv_sum[size_t(bj * kvrow + e)], dqkv[size_t(bj * row + C + e)], 1e-5) << "position " << bj;
      }
  }
}

// The fast kernel against the reference on a zigzag rank of cp 3 (two runs of positions) and
// a plain one, with document masks: within attention's cpu-vs-ref bound (1e-5 of the scale).
TEST(CpAttention, FastKernelMatchesTheReference) {
  std::mt19937 rng(11);
  Case c;
  c.T = 48, c.H = 6, c.KV = 3, c.hd = 16;
  const int64_t row = c.row(), C = c.H * c.hd;
  const std::vector<float> qkv = normal(rng, size_t(c.B * c.T * row));
  const std::vector<int32_t> starts = doc_starts(rng, c);
  for (const auto& [cp, r, split] : {std::tuple{3, 1, CpSplit::kZigZag}, std::tuple{4, 3, CpSplit::kPlain}}) {
    const Local l = local_of(c, qkv, &starts, rank::cp_positions(c.T, cp, r, split));
    const int64_t Tq = int64_t(l.pos.size());
    std::vector<float> o1(size_t(c.B * Tq * C)), o2 = o1, p1(size_t(c.B * c.H * Tq * c.T)), p2 = p1;
    ref::cp_attention_forward(o1.data(), p1.data(), l.qkv.data(), l.kv.data(), l.pos.data(), c.B, Tq, c.T, c.H, c.KV,
                              c.hd, l.doc.data());
    cpu::cp_attention_forward(o2.data(), p2.data(), l.qkv.data(), l.kv.data(), l.pos.data(), c.B, Tq, c.T, c.H, c.KV,
                              c.hd, l.doc.data());
    EXPECT_LT(off(o2, o1), 1e-5) << "cp " << cp;
    EXPECT_LT(off(p2, p1), 1e-5) << "cp " << cp;
    const std::vector<float> dy = normal(rng, o1.size());
    std::vector<float> dq1(l.qkv.size(), 0.25f), dq2 = dq1, dkv1(l.kv.size(), -0.5f), dkv2 = dkv1;
    ref::cp_attention_backward(dq1.data(), dkv1.data(), dy.data(), l.qkv.data(), l.kv.data(), p1.data(), l.pos.data(),
                               c.B, Tq, c.T, c.H, c.KV, c.hd);
    cpu::cp_attention_backward(dq2.data(), dkv2.data(), dy.data(), l.qkv.data(), l.kv.data(), p1.data(), l.pos.data(),
                               c.B, Tq, c.T, c.H, c.KV, c.hd);
    EXPECT_LT(off(dq2, dq1), 1e-5) << "cp " << cp;
    EXPECT_LT(off(dkv2, dkv1), 1e-5) << "cp " << cp;
    // Note [bf16 attention probabilities]: the rounded probabilities, kept in bf16 or as fp32;
    // the two keepings give the same results, and the fast kernel the reference's within its
    // bound (a probability near a rounding boundary may round the other way: 2^-8 of it).
    std::vector<float> b1(o1.size()), b2 = b1, b3 = b1, q1(p1.size()), q3(p1.size());
    std::vector<bf16> h2(p1.size());
    ref::cp_attention_forward_bf16(b1.data(), q1.data(), nullptr, l.qkv.data(), l.kv.data(), l.pos.data(), c.B, Tq, c.T,
                                   c.H, c.KV, c.hd, l.doc.data());
    cpu::cp_attention_forward_bf16(b2.data(), nullptr, h2.data(), l.qkv.data(), l.kv.data(), l.pos.data(), c.B, Tq, c.T,
                                   c.H, c.KV, c.hd, l.doc.data());
    cpu::cp_attention_forward_bf16(b3.data(), q3.data(), nullptr, l.qkv.data(), l.kv.data(), l.pos.data(), c.B, Tq, c.T,
                                   c.H, c.KV, c.hd, l.doc.data());
    EXPECT_EQ(b2, b3);
    for (size_t i = 0; i < q3.size(); ++i) ASSERT_EQ(q3[i], from_bf16(h2[i])) << i;
    for (size_t i = 0; i < q1.size(); ++i) ASSERT_NEAR(q3[i], q1[i], q1[i] * 0.0079 + 1e-6) << i;
    EXPECT_LT(off(b2, b1), 1e-2) << "cp " << cp;
    EXPECT_GT(off(b1, o1), 0.0) << "the probabilities are rounded";
    std::vector<float> e1(l.qkv.size(), 0.0f), e2 = e1, k1(l.kv.size(), 0.0f), k2 = k1;
    ref::cp_attention_backward_bf16(e1.data(), k1.data(), dy.data(), l.qkv.data(), l.kv.data(), q3.data(), nullptr,
                                    l.pos.data(), c.B, Tq, c.T, c.H, c.KV, c.hd);
    cpu::cp_attention_backward_bf16(e2.data(), k2.data(), dy.data(), l.qkv.data(), l.kv.data(), nullptr, h2.data(),
                                    l.pos.data(), c.B, Tq, c.T, c.H, c.KV, c.hd);
    EXPECT_LT(off(e2, e1), 1e-5) << "cp " << cp;
    EXPECT_LT(off(k2, k1), 1e-5) << "cp " << cp;
  }
}

// Note [Ring attention]: a rank's rows against the cp ranks' K|V blocks one at a time, in the
// ring's order (rank r at step s holds rank (r - s) mod cp's block), with the online softmax,
// equal the all-gather kernel's output, and each row's log-sum-exp is the one its
// probabilities have (lse = s_tt - log p_tt at the row's own key, always visible); the
// backward steps, recomputing P from lse, give the all-gather kernel's dQ, and each block's
// travelling dK|dV its rows of the gathered dK|dV. cp 2, 3, 4, zigzag and plain, masked and
// not, the reference and the fast kernels (the online rescaling and D = rowsum(dO O) reorder
// float sums: 1e-5 of the scale, attention's cpu-vs-ref bound).
TEST(RingAttention, BlocksAroundTheRingEqualTheGatheredKernel) {
  std::mt19937 rng(13);
  Case c;
  c.T = 48, c.H = 4, c.KV = 2, c.hd = 16;
  const int64_t row = c.row(), kvrow = 2 * c.KV * c.hd, C = c.H * c.hd;
  const std::vector<float> qkv = normal(rng, size_t(c.B * c.T * row));
  const std::vector<int32_t> starts = doc_starts(rng, c);
  auto block_of = [&](const Local& whole, const std::vector<int32_t>& pos) {
    std::vector<float> kv(size_t(c.B * int64_t(pos.size()) * kvrow));
    for (int64_t b = 0; b < c.B; ++b)
      for (size_t u = 0; u < pos.size(); ++u)
        std::copy_n(whole.kv.begin() + (b * c.T + pos[u]) * kvrow, kvrow, kv.begin() + (b * int64_t(pos.size()) + int64_t(u)) * kvrow);
    return kv;
  };
  for (const bool fast : {false, true})
    for (const bool masked : {false, true})
      for (int cp : {2, 3, 4})
        for (const CpSplit split : {CpSplit::kZigZag, CpSplit::kPlain}) {
          SCOPED_TRACE(std::string(fast ? "cpu" : "ref") + " cp " + std::to_string(cp) +
                       (split == CpSplit::kZigZag ? " zigzag" : " plain") + (masked ? " masked" : ""));
          const auto step = fast ? cpu::ring_attention_step : ref::ring_attention_step;
          const auto finish = fast ? cpu::ring_attention_finish : ref::ring_attention_finish;
          const auto back = fast ? cpu::ring_attention_backward_step : ref::ring_attention_backward_step;
          const int r = cp - 1;
          const Local l = local_of(c, qkv, masked ? &starts : nullptr, rank::cp_positions(c.T, cp, r, split));
          const int64_t Tq = int64_t(l.pos.size());
          const int32_t* doc = masked ? l.doc.data() : nullptr;
          std::vector<float> o(size_t(c.B * Tq * C)), p(size_t(c.B * c.H * Tq * c.T));
          ref::cp_attention_forward(o.data(), p.data(), l.qkv.data(), l.kv.data(), l.pos.data(), c.B, Tq, c.T, c.H, c.KV,
                                    c.hd, doc);
          std::vector<float> acc(o.size(), 0.0f), ml(size_t(c.B * c.H * Tq * 2)), ro(o.size()), lse(size_t(c.B * c.H * Tq));
          for (size_t i = 0; i < ml.size(); i += 2) ml[i] = -INFINITY, ml[i + 1] = 0.0f;
          for (int s = 0; s < cp; ++s) {
            const std::vector<int32_t> pos = rank::cp_positions(c.T, cp, (r - s + cp) % cp, split);
            const std::vector<float> kv = block_of(l, pos);
            step(acc.data(), ml.data(), l.qkv.data(), kv.data(), l.pos.data(), pos.data(), c.B, Tq, Tq, c.H, c.KV, c.hd,
                 doc);
          }
          finish(ro.data(), lse.data(), acc.data(), ml.data(), c.B, Tq, c.H, c.hd);
          EXPECT_LT(off(ro, o), 1e-5);
          std::vector<float> want(lse.size());
          for (int64_t b = 0; b < c.B; ++b)
            for (int64_t h = 0; h < c.H; ++h)
              for (int64_t t = 0; t < Tq; ++t) {
                const int64_t j = l.pos[size_t(t)];
                const float* q = l.qkv.data() + (b * Tq + t) * row + h * c.hd;
                const float* k = l.kv.data() + (b * c.T + j) * kvrow + (h / (c.H / c.KV)) * c.hd;
                double s = 0;
                for (int64_t e = 0; e < c.hd; ++e) s += double(q[e]) * k[e];
                want[size_t((b * c.H + h) * Tq + t)] =
                    float(s / std::sqrt(double(c.hd)) - std::log(double(p[size_t(((b * c.H + h) * Tq + t) * c.T + j)])));
              }
          EXPECT_LT(off(lse, want), 1e-5);
          const std::vector<float> dy = normal(rng, o.size());
          std::vector<float> dq(l.qkv.size(), 0.0f), dkv(l.kv.size(), 0.0f), rdq = dq, rdkv = dkv, D(size_t(c.B * c.H * Tq));
          ref::cp_attention_backward(dq.data(), dkv.data(), dy.data(), l.qkv.data(), l.kv.data(), p.data(), l.pos.data(),
                                     c.B, Tq, c.T, c.H, c.KV, c.hd);
          for (int64_t b = 0; b < c.B; ++b)
            for (int64_t h = 0; h < c.H; ++h)
              for (int64_t t = 0; t < Tq; ++t) {
                double d = 0;
                for (int64_t e = 0; e < c.hd; ++e)
                  d += double(dy[size_t((b * Tq + t) * C + h * c.hd + e)]) * ro[size_t((b * Tq + t) * C + h * c.hd + e)];
                D[size_t((b * c.H + h) * Tq + t)] = float(d);
              }
          for (int s = 0; s < cp; ++s) {
            const std::vector<int32_t> pos = rank::cp_positions(c.T, cp, (r - s + cp) % cp, split);
            const std::vector<float> kv = block_of(l, pos);
            std::vector<float> g(kv.size(), 0.0f);
            back(rdq.data(), g.data(), dy.data(), D.data(), l.qkv.data(), kv.data(), lse.data(), l.pos.data(), pos.data(),
                 c.B, Tq, Tq, c.H, c.KV, c.hd, doc);
            for (int64_t b = 0; b < c.B; ++b)  // the block's rows back at their positions
              for (size_t u = 0; u < pos.size(); ++u)
                std::copy_n(g.begin() + (b * Tq + int64_t(u)) * kvrow, kvrow, rdkv.begin() + (b * c.T + pos[u]) * kvrow);
          }
          EXPECT_LT(off(rdq, dq), 1e-5);
          EXPECT_LT(off(rdkv, dkv), 1e-5);
        }
}

}  // namespace
}  // namespace loom
