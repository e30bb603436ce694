// Collectives on the in-process thread backend, for every rank count 1..8, against closed
// forms (rank r contributes values that make the exact answer obvious) and against a
// double-precision sum of random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>

#include "loom/comm/algorithms.h"
#include "loom/comm/world.h"

namespace loom::comm {
namespace {

CommOptions fast_options() {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(20'000);
  return o;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// x_r[i] = (r + 1) * (i % 7 + 1): the sum over n ranks is n (n + 1) / 2 * (i % 7 + 1).
template <typename T>
std::vector<T> closed_form_input(int r, size_t count) {
  std::vector<T> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<T>((r + 1) * static_cast<int>(i % 7 + 1));
  return x;
}

// 70001 f32 and 140001 f64 span several shared-memory chunks.
const size_t kCounts[] = {0, 1, 5, 13, 1000, 70001, 140001};

class AllReduce : public ::testing::TestWithParam<std::tuple<int, Algorithm>> {};

TEST_P(AllReduce, SumAvgMaxMatchClosedForms) {
  const auto [n, algorithm] = GetParam();
  expect_no_errors(run_threads(n, fast_options(), [&, n = n, algorithm = algorithm](World& w) {
    Group& g = w.world_group();
    const int r = w.global_rank();
    for (size_t count : kCounts) {
      std::vector<float> x = closed_form_input<float>(r, count);
      g.all_reduce(std::span(x), ReduceOp::kSum, {algorithm});
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], n * (n + 1) / 2 * float(i % 7 + 1)) << count << " " << i;
      std::vector<double> y = closed_form_input<double>(r, count);
      g.all_reduce(std::span(y), ReduceOp::kAvg, {algorithm});
      for (size_t i = 0; i < count; ++i) ASSERT_DOUBLE_EQ(y[i], (n + 1) / 2.0 * double(i % 7 + 1));
      std::vector<int32_t> z = closed_form_input<int32_t>(r, count);
      g.all_reduce(std::span(z), ReduceOp::kMax, {algorithm});
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(z[i], n * int(i % 7 + 1));
    }
  }));
}

// Random float data: every rank ends with the same bits, within float rounding of the
// double-precision sum.
TEST_P(AllReduce, RandomDataIsBitIdenticalOnAllRanksAndCloseToTheExactSum) {
  const auto [n, algorithm] = GetParam();
  const size_t count = 4099;
  std::vector<std::vector<float>> results(n);
  std::random_device seed_source;
  const unsigned seed = seed_source();
  expect_no_errors(run_threads(n, fast_options(), [&, algorithm = algorithm](World& w) {
    const int r = w.global_rank();
    std::mt19937 rng(seed + r);
    std::normal_distribution<float> dist;
    std::vector<float> x(count);
    for (float& v : x) v = dist(rng);
    w.world_group().all_reduce(std::span(x), ReduceOp::kSum, {algorithm});
    results[r] = x;
  }));
  std::vector<double> exact(count, 0.0);
  for (int r = 0; r < n; ++r) {
    std::mt19937 rng(seed + r);
    std::normal_distribution<float> dist;
    for (size_t i = 0; i < count; ++i) exact[i] += dist(rng);
  }
  for (int r = 1; r < n; ++r) ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * 4)) << "rank " << r;
  for (size_t i = 0; i < count; ++i) ASSERT_NEAR(results[0][i], exact[i], 1e-5 * n * 4) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduce,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(Algorithm::kRing, Algorithm::kRecursive, Algorithm::kShm)),
                         [](const auto& info) {
                           return std::string(algorithm_name(std::get<1>(info.param))) + "_" +
                                  std::to_string(std::get<0>(info.param));
                         });

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, ReduceScatterAndAllGatherIncludingInPlace) {
  const int n = GetParam();
  expect_no_errors(run_threads(n, fast_options(), [&](World& w) {
    Group& g = w.world_group();
    const int r = w.global_rank();
    // 70001 elements a block: several shared-memory rounds (Note [Shared-memory reduce-scatter]).
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(3001), size_t(70001)})
      for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kShm}) {
        // Block j of rank r's input holds (r + 1) * (j * 1000 + i); rank j gets n(n+1)/2 * that.
        std::vector<float> in(count * n);
        for (int j = 0; j < n; ++j)
          for (size_t i = 0; i < count; ++i) in[j * count + i] = float((r + 1) * (j * 1000 + int(i % 100)));
        std::vector<float> out(count);
        g.reduce_scatter(std::span<const float>(in), std::span(out), ReduceOp::kSum, {a});
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(out[i], float(n * (n + 1) / 2 * (r * 1000 + int(i % 100)))) << algorithm_name(a);
        // In place: the output is this rank's own block of the input.
        std::span<float> own(in.data() + r * count, count);
        g.reduce_scatter(std::span<const float>(in), own, ReduceOp::kAvg, {a});
        for (size_t i = 0; i < count; ++i)
          ASSERT_FLOAT_EQ(own[i], (n + 1) / 2.0f * float(r * 1000 + int(i % 100))) << algorithm_name(a);
      }
    // 70001 int64 a block: several shared-memory rounds of the all-gather.
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(3001), size_t(70001)})
      for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kShm}) {
        std::vector<int64_t> mine(count), all(count * n);
        for (size_t i = 0; i < count; ++i) mine[i] = int64_t(r) * 100000 + int64_t(i);
        g.all_gather(std::span<const int64_t>(mine), std::span(all), {a});
        for (int j = 0; j < n; ++j)
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(all[j * count + i], int64_t(j) * 100000 + int64_t(i)) << algorithm_name(a);
        std::vector<int64_t> all2(count * n, -1);
        std::copy(mine.begin(), mine.end(), all2.begin() + r * count);
        g.all_gather(std::span<const int64_t>(all2.data() + r * count, count), std::span(all2), {a});
        ASSERT_EQ(all2, all) << algorithm_name(a);
      }
  }));
}

// Note [Shared-memory reduce-scatter]: on random data rank r's output is, bit for bit, the
// ring's: block r of rank r + 1, plus that of r + 2, ..., plus its own last, summed in float;
// and the ring gives the same bits.
TEST_P(Collectives, SharedMemoryReduceScatterGivesTheRingsBits) {
  const int n = GetParam();
  const size_t count = 70001;
  std::random_device seed_source;
  const unsigned seed = seed_source();
  auto input = [&](int r) {
    std::mt19937 rng(seed + unsigned(r));
    std::normal_distribution<float> dist;
    std::vector<float> x(count * size_t(n));
    for (float& v : x) v = dist(rng);
    return x;
  };
  std::vector<std::vector<float>> got(static_cast<size_t>(n)), ring(static_cast<size_t>(n));
  expect_no_errors(run_threads(n, fast_options(), [&](World& w) {
    const int r = w.global_rank();
    const std::vector<float> in = input(r);
    got[size_t(r)].assign(count, 0.0f);
    ring[size_t(r)].assign(count, 0.0f);
    w.world_group().reduce_scatter(std::span<const float>(in), std::span(got[size_t(r)]), ReduceOp::kSum,
                                   {Algorithm::kShm});
    w.world_group().reduce_scatter(std::span<const float>(in), std::span(ring[size_t(r)]), ReduceOp::kSum,
                                   {Algorithm::kRing});
  }));
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(input(r));
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(got[size_t(r)], ring[size_t(r)]) << "rank " << r << " seed " << seed;
    for (size_t i = 0; i < count; ++i) {
      float want = inputs[size_t((r + 1) % n)][size_t(r) * count + i];
      for (int j = 2; j <= n; ++j) want += inputs[size_t((r + j) % n)][size_t(r) * count + i];
      ASSERT_EQ(got[size_t(r)][i], want) << "rank " << r << " element " << i << " seed " << seed;
    }
  }
}

TEST_P(Collectives, BroadcastAndReduceFromEveryRoot) {
  const int n = GetParam();
  expect_no_errors(run_threads(n, fast_options(), [&](World& w) {
    Group& g = w.world_group();
    const int r = w.global_rank();
    for (int root = 0; root < n; ++root) {
      std::vector<double> x(517, r == root ? 3.5 + root : -1.0);
      g.broadcast(std::span(x), root);
      for (double v : x) ASSERT_EQ(v, 3.5 + root);
      std::vector<int32_t> in(33, r + 1), out(r == root ? 33 : 0);
      g.reduce(std::span<const int32_t>(in), std::span(out), root);
      if (r == root) {
        for (int32_t v : out) ASSERT_EQ(v, n * (n + 1) / 2);
      }
    }
  }));
}

TEST_P(Collectives, AllToAllSendRecvBatchAndBarrier) {
  const int n = GetParam();
  expect_no_errors(run_threads(n, fast_options(), [&](World& w) {
    Group& g = w.world_group();
    const int r = w.global_rank();
    const size_t block = 11;
    std::vector<int32_t> in(block * n), out(block * n);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < block; ++i) in[j * block + i] = r * 10000 + j * 100 + int(i);  // from r to j
    g.all_to_all(std::span<const int32_t>(in), std::span(out));
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < block; ++i) ASSERT_EQ(out[j * block + i], j * 10000 + r * 100 + int(i));
    if (n > 1) {
      // A ring of sends: batched so no rank blocks on its send first.
      std::vector<float> to_right(100, float(r)), from_left(100, -1.f);
      g.batch({isend_op(std::span<const float>(to_right), (r + 1) % n, 5),
               irecv_op(std::span(from_left), (r + n - 1) % n, 5)});
      for (float v : from_left) ASSERT_EQ(v, float((r + n - 1) % n));
      // Plain send/recv: rank 0 sends two tagged messages to rank 1, which receives them in order.
      if (r == 0) {
        const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5};
        g.send(std::span<const int32_t>(a), 1, 7);
        g.send(std::span<const int32_t>(b), 1, 7);
      } else if (r == 1) {
        std::vector<int32_t> a(3), b(2);
        g.recv(std::span(a), 0, 7);
        g.recv(std::span(b), 0, 7);
        ASSERT_EQ(a, (std::vector<int32_t>{1, 2, 3}));
        ASSERT_EQ(b, (std::vector<int32_t>{4, 5}));
      }
    }
    g.barrier();
  }));
}

TEST_P(Collectives, AsyncCallsRunInIssueOrderAndOverlapTheCaller) {
  const int n = GetParam();
  expect_no_errors(run_threads(n, fast_options(), [&](World& w) {
    Group& g = w.world_group();
    const int r = w.global_rank();
    std::vector<std::vector<float>> bufs;
    for (int k = 0; k < 6; ++k) bufs.emplace_back(1000 + k * 501, float(r + k));
    std::vector<Work> works;
    for (auto& b : bufs) works.push_back(g.all_reduce(std::span(b), ReduceOp::kSum, {.async = true}));
    // A blocking call waits for the queued ones first.
    std::vector<float> last(10, 1.f);
    g.all_reduce(std::span(last));
    for (float v : last) ASSERT_EQ(v, float(n));
    for (int k = 0; k < 6; ++k) {
      works[k].wait();
      ASSERT_TRUE(works[k].done());
      for (float v : bufs[k]) ASSERT_EQ(v, float(n * (n - 1) / 2 + n * k));
    }
  }));
}

TEST_P(Collectives, BF16SumRoundsOncePerAddition) {
  const int n = GetParam();
  expect_no_errors(run_threads(n, fast_options(), [&](World& w) {
    std::vector<bf16> x(301, float_to_bf16(0.5f));
    w.world_group().all_reduce(std::span(x));
    for (bf16 v : x) ASSERT_EQ(bf16_to_float(v), 0.5f * n);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Range(1, 9));

// Note [Background waits]: a worker waiting on a transfer nobody waits for yet naps a quarter
// of the time waited (50 us to 1 ms); a send, which only its end waits on, 1 ms from the start.
TEST(BackgroundWaits, ASendNapsTheLongestNapFromItsFirstWait) {
  using std::chrono::microseconds;
  EXPECT_EQ(comm::background_nap_length(microseconds(0), false), microseconds(50));
  EXPECT_EQ(comm::background_nap_length(microseconds(400), false), microseconds(100));
  EXPECT_EQ(comm::background_nap_length(microseconds(40000), false), microseconds(1000));
  EXPECT_EQ(comm::background_nap_length(microseconds(0), true), microseconds(1000));
  EXPECT_EQ(comm::background_nap_length(microseconds(400), true), microseconds(1000));
}

// Groups from a mesh: pp=2 x dp=2 x tp=2 on 8 threads; each group sums its global ranks.
TEST(MeshGroups, SumsOverEachAxisMatchTheMembers) {
  expect_no_errors(run_threads(8, fast_options(), [](World& w) {
    const Mesh mesh({{"pp", 2}, {"dp", 2}, {"tp", 2}}, 8);
    for (const std::vector<std::string>& axes : std::vector<std::vector<std::string>>{{"tp"}, {"dp"}, {"pp"}, {"dp", "tp"}}) {
      std::unique_ptr<Group> g = w.group(mesh, axes);
      const GroupMembership m = mesh.membership(axes, w.global_rank());
      ASSERT_EQ(g->members(), m.global_ranks);
      ASSERT_EQ(g->group_rank(), m.group_rank);
      int64_t v = w.global_rank();
      g->all_reduce(std::span(&v, 1));
      ASSERT_EQ(v, std::accumulate(m.global_ranks.begin(), m.global_ranks.end(), int64_t{0})) << g->name();
    }
  }));
}

}  // namespace
}  // namespace loom::comm

namespace loom::comm {
namespace {

// Ranks pretending to sit on several hosts: the hierarchical all-reduce (node all-reduce,
// ring among node leaders, node broadcast) matches the closed forms, gives every rank the
// same bits, and is what `auto` picks when a node holds more than one member.
TEST(Hierarchical, MatchesClosedFormsOnUnevenAndInterleavedNodes) {
  const std::vector<std::vector<std::string>> layouts = {
      {"a", "a", "b", "b"}, {"a", "a", "a", "b", "b"}, {"a", "b", "a", "b", "c", "c"}, {"a", "b", "c"}};
  for (const auto& hosts : layouts) {
    const int n = static_cast<int>(hosts.size());
    std::vector<std::vector<float>> results(n);
    const auto errors = run_threads(
        n, fast_options(),
        [&](World& w) {
          Group& g = w.world_group();
          const int r = w.global_rank();
          for (size_t count : {size_t(0), size_t(1), size_t(13), size_t(70001)}) {
            std::vector<float> x = closed_form_input<float>(r, count);
            g.all_reduce(std::span(x), ReduceOp::kSum, {Algorithm::kHierarchical});
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], n * (n + 1) / 2 * float(i % 7 + 1));
            std::vector<double> y = closed_form_input<double>(r, count);
            g.all_reduce(std::span(y), ReduceOp::kAvg);  // auto
            for (size_t i = 0; i < count; ++i) ASSERT_DOUBLE_EQ(y[i], (n + 1) / 2.0 * double(i % 7 + 1));
            std::vector<int32_t> z = closed_form_input<int32_t>(r, count);
            g.all_reduce(std::span(z), ReduceOp::kMax, {Algorithm::kHierarchical});
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(z[i], n * int(i % 7 + 1));
          }
          std::vector<float> noise(5003);
          for (size_t i = 0; i < noise.size(); ++i) noise[i] = std::sin(float(i * (r + 3)));
          g.all_reduce(std::span(noise));
          results[r] = noise;
          const bool one_per_node = hosts.size() == 3;
          EXPECT_EQ(w.ledger().entries().back().algorithm, one_per_node ? Algorithm::kRecursive : Algorithm::kHierarchical);
        },
        hosts);
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r << " of " << n;
    for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]) << "rank " << r << " of " << n;
  }
}

TEST(Hierarchical, RefusedInsideOneNode) {
  const auto errors = run_threads(2, fast_options(), [](World& w) {
    float x = 1;
    try {
      w.world_group().all_reduce(std::span(&x, 1), ReduceOp::kSum, {Algorithm::kHierarchical});
      ADD_FAILURE() << "hierarchical ran inside one node";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs a group spanning several nodes"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(errors[0], "");
}

}  // namespace
}  // namespace loom::comm

namespace loom::comm {
namespace {

// Compressed payloads: every rank gets the same bits, within the documented error of the
// exact sum (bf16: 8 significant bits per hop; int8: scale / 2 per value per hop).
class Compressed : public ::testing::TestWithParam<std::tuple<int, Compression>> {};

TEST_P(Compressed, ErrorStaysWithinThePerHopBoundAndRanksAgree) {
  const auto [n, c] = GetParam();
  const size_t count = 3 * kQuantBlock * n + 17;
  std::vector<std::vector<float>> results(n);
  const unsigned seed = std::random_device{}();
  auto input = [&](int r) {
    std::mt19937 rng(seed + r);
    std::normal_distribution<float> dist;
    std::vector<float> x(count);
    for (float& v : x) v = dist(rng);
    return x;
  };
  expect_no_errors(run_threads(n, fast_options(), [&, c = c](World& w) {
    std::vector<float> x = input(w.global_rank());
    w.world_group().all_reduce(std::span(x), ReduceOp::kSum, {.compression = c});
    results[w.global_rank()] = x;
  }));
  double abs_max = 0;  // largest partial sum magnitude bounds every block's scale
  std::vector<double> exact(count, 0.0), abs_sum(count, 0.0);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> x = input(r);
    for (size_t i = 0; i < count; ++i) {
      exact[i] += x[i];
      abs_sum[i] += std::fabs(x[i]);
    }
  }
  for (double a : abs_sum) abs_max = std::max(abs_max, a);
  for (int r = 1; r < n; ++r) ASSERT_EQ(results[r], results[0]) << "rank " << r;
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    const double err = std::fabs(results[0][i] - exact[i]);
    const double bound = c == Compression::kBF16 ? n * std::ldexp(abs_sum[i], -8) + 1e-6 : n * abs_max / 254 + 1e-6;
    ASSERT_LE(err, bound) << "element " << i << " seed " << seed;
    worst = std::max(worst, err / abs_max);
  }
  if (n > 1) {
    EXPECT_GT(worst, 0) << "compression changed nothing: is it running?";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Compressed,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                                            ::testing::Values(Compression::kBF16, Compression::kInt8)),
                         [](const auto& info) {
                           return std::string(compression_name(std::get<1>(info.param))) + "_" +
                                  std::to_string(std::get<0>(info.param));
                         });

// Note [Ring codecs] on the reduce-scatter (ZeRO-2/3's compressed gradients): each rank's
// block, reduced in place as GradSync does (out is block r of in), is within the same
// per-hop bound of the exact sum; avg divides it by n.
TEST_P(Compressed, ReduceScatterStaysWithinThePerHopBound) {
  const auto [n, c] = GetParam();
  const size_t count = 2 * kQuantBlock + 5;  // per rank
  std::vector<std::vector<float>> pieces(n);
  const unsigned seed = std::random_device{}();
  auto input = [&](int r) {
    std::mt19937 rng(seed + 7 * r);
    std::normal_distribution<float> dist;
    std::vector<float> x(count * size_t(n));
    for (float& v : x) v = dist(rng);
    return x;
  };
  expect_no_errors(run_threads(n, fast_options(), [&, c = c](World& w) {
    const int r = w.global_rank();
    std::vector<float> x = input(r);
    std::span<float> own = std::span(x).subspan(size_t(r) * count, count);
    w.world_group().reduce_scatter(std::span<const float>(x), own, ReduceOp::kAvg, {.compression = c});
    pieces[r].assign(own.begin(), own.end());
  }));
  double worst = 0;
  for (int r = 0; r < n; ++r) {
    std::vector<double> exact(count, 0.0), abs_sum(count, 0.0);
    double abs_max = 0;
    for (int q = 0; q < n; ++q) {
      const std::vector<float> x = input(q);
      for (size_t i = 0; i < count; ++i) {
        exact[i] += x[size_t(r) * count + i];
        abs_sum[i] += std::fabs(x[size_t(r) * count + i]);
      }
    }
    for (double a : abs_sum) abs_max = std::max(abs_max, a);
    for (size_t i = 0; i < count; ++i) {
      const double err = std::fabs(double(pieces[r][i]) * n - exact[i]);
      const double bound = c == Compression::kBF16 ? n * std::ldexp(abs_sum[i], -8) + 1e-5 : n * abs_max / 254 + 1e-5;
      ASSERT_LE(err, bound) << "rank " << r << " element " << i << " seed " << seed;
      worst = std::max(worst, err / abs_max);
    }
  }
  if (n > 1) {
    EXPECT_GT(worst, 0) << "compression changed nothing: is it running?";
  }
}

TEST(Compressed, OnlyF32SumOrAvgOnTheRing) {
  const auto errors = run_threads(2, fast_options(), [](World& w) {
    std::vector<double> d(10);
    std::vector<float> f(10);
    EXPECT_THROW(w.world_group().all_reduce(std::span(d), ReduceOp::kSum, {.compression = Compression::kInt8}), Error);
    EXPECT_THROW(w.world_group().all_reduce(std::span(f), ReduceOp::kMax, {.compression = Compression::kBF16}), Error);
    EXPECT_THROW(w.world_group().all_reduce(std::span(f), ReduceOp::kSum,
                                            {.algorithm = Algorithm::kShm, .compression = Compression::kBF16}),
                 Error);
    w.world_group().all_reduce(std::span(f), ReduceOp::kAvg, {.compression = Compression::kBF16});
    std::vector<float> out(5);
    EXPECT_THROW(w.world_group().reduce_scatter(std::span<const float>(f), std::span(out), ReduceOp::kMax,
                                                {.compression = Compression::kInt8}),
                 Error);
    std::vector<double> dd(10), dout(5);
    EXPECT_THROW(w.world_group().reduce_scatter(std::span<const double>(dd), std::span(dout), ReduceOp::kSum,
                                                {.compression = Compression::kBF16}),
                 Error);
    w.world_group().reduce_scatter(std::span<const float>(f), std::span(out), ReduceOp::kSum,
                                   {.compression = Compression::kBF16});
  });
  EXPECT_EQ(errors[0], "");
}

}  // namespace
}  // namespace loom::comm
