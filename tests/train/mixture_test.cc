// Note [Dataset mixtures]: data.shards = "0.7:web,0.3:code" draws each global sample from
// one source by weight; the draw is a function of the sample alone (every layout, every
// resume), each period of kMixPeriod samples holds each source's exact share, and each
// source reads its own windows in epoch order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <map>
#include <set>

#include "loom/data/loader.h"
#include "loom/data/mixture.h"
#include "loom/train/trainer.h"
#include "support/error_message.h"
#include "support/fortune_shards.h"
#include "support/global_batch.h"
#include "support/temp_dir.h"
#include "support/train_threads.h"

namespace loom {
namespace {

using testing_support::error_message;
using testing_support::TempDir;

TEST(MixtureSources, ParsesWeightsAndRefusesWhatIsNotAMixture) {
  const auto two = data::parse_shard_sources("0.7:web, 0.3 : code");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].dir, "web");
  EXPECT_EQ(two[1].dir, "code");
  EXPECT_DOUBLE_EQ(two[0].weight, 0.7);
  EXPECT_DOUBLE_EQ(two[1].weight + two[0].weight, 1.0);
  const auto scaled = data::parse_shard_sources("3:a,1:b");  // normalised
  EXPECT_DOUBLE_EQ(scaled[0].weight, 0.75);
  EXPECT_EQ(data::parse_shard_sources("some/dir")[0].dir, "some/dir");
  EXPECT_EQ(data::parse_shard_sources("1:some/dir")[0].dir, "some/dir");
  TempDir d{"loom-mixname"};  // an existing directory named like a mixture is that directory
  const std::string odd = (d / "0.5:x,y");
  std::filesystem::create_directories(odd);
  ASSERT_EQ(data::parse_shard_sources(odd).size(), 1u);
  EXPECT_EQ(data::parse_shard_sources(odd)[0].dir, odd);
  for (const auto& [spec, want] : std::vector<std::pair<std::string, std::string>>{
           {"0.7:web,code", "item 'code' has no weight"},
           {"0.7:web,-1:code", "the weight of '-1:code' must be a finite number > 0"},
           {"0.7:web,0:code", "the weight of '0:code' must be a finite number > 0"},
           {"0.5:web,0.5:web", "names 'web' twice"},
           {"0.5:web,0.5:", "names no directory"}})
    EXPECT_NE(error_message([&] { data::parse_shard_sources(spec); }).find(want), std::string::npos) << spec;
}

TEST(Mixture, EachPeriodHoldsEachSourceItsSlotsAndEveryIndexOnce) {
  for (const std::vector<double>& w : std::vector<std::vector<double>>{
           {0.5, 0.3, 0.2}, {1.0 / 3, 1.0 / 3, 1.0 / 3}, {0.9999, 0.0001}, {0.123456, 0.876544}}) {
    const data::Mixture m(w);
    uint64_t total = 0;
    for (size_t k = 0; k < w.size(); k++) {
      EXPECT_LE(std::abs(double(m.slots(int(k))) - w[k] * double(data::kMixPeriod)), 1.0);
      total += m.slots(int(k));
    }
    EXPECT_EQ(total, data::kMixPeriod);
    // Over two periods source k's draws are its samples 0 .. 2 n_k - 1, each once.
    std::vector<std::set<uint64_t>> seen(w.size());
    for (uint64_t g = 0; g < 2 * data::kMixPeriod; g++) {
      const data::Mixture::Pick p = m.pick(g, 11);
      EXPECT_TRUE(seen[size_t(p.source)].insert(p.index).second) << "source " << p.source << " index " << p.index;
    }
    for (size_t k = 0; k < w.size(); k++) {
      ASSERT_EQ(seen[k].size(), 2 * m.slots(int(k)));
      EXPECT_EQ(*seen[k].rbegin(), 2 * m.slots(int(k)) - 1);
    }
    // drawn() (whole periods in closed form) counts what pick() draws.
    std::mt19937_64 rng(std::random_device{}());
    const uint64_t upto = 2 * data::kMixPeriod + rng() % data::kMixPeriod;
    std::vector<uint64_t> count(w.size());
    for (uint64_t g = 0; g < upto; g++) count[size_t(m.pick(g, 11).source)]++;
    EXPECT_EQ(m.drawn(upto, 11), count) << upto;
  }
  EXPECT_NE(error_message([] { data::Mixture({1 - 1e-6, 1e-6}); }).find("draws no sample in a period of 10000"),
            std::string::npos);
}

// Two sources of distinct tokens: A in [0, 100), B in [100, 200).
struct TwoSources {
  TempDir dir{"loom-mix"};
  std::unique_ptr<data::MixedStream> stream;
  explicit TwoSources(std::vector<double> weights, uint64_t a_tokens = 2001, uint64_t b_tokens = 501) {
    std::mt19937 rng(std::random_device{}());
    std::vector<std::unique_ptr<data::ShardStream>> parts;
    uint32_t lo = 0;
    for (uint64_t n : {a_tokens, b_tokens}) {
      std::vector<uint32_t> t(n);
      for (auto& x : t) x = lo + rng() % 100;
      data::ShardHeader h;
      h.vocab_size = 200;
      const std::string path = dir / ("src_" + std::to_string(lo) + ".bin");
      data::write_shard(path, h, t, std::vector<uint64_t>{0});
      std::vector<std::unique_ptr<data::Shard>> one;
      one.push_back(std::make_unique<data::Shard>(path));
      parts.push_back(std::make_unique<data::ShardStream>(std::move(one)));
      lo += 100;
    }
    stream = std::make_unique<data::MixedStream>(std::move(parts), std::vector<std::string>{"a", "b"},
                                                 data::Mixture(std::move(weights)));
  }
};

TEST(MixtureLoader, EveryRowIsFromItsPickedSourceAndThe1000StepSharesAreTheWeights) {
  const TwoSources s({0.7, 0.3});
  const int64_t T = 10, B = 8, steps = 1000;
  const DataLoader loader(*s.stream, T, 5, 0, 1, DataOrder::kEpoch);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  uint64_t from_b = 0;
  for (int64_t step = 0; step < steps; step++) {
    loader.train_batch(step, 0, 1, B, tok.data(), tgt.data());
    for (int64_t r = 0; r < B; r++) {
      const int source = s.stream->mixture().pick(uint64_t(step * B + r), 5).source;
      from_b += source;
      for (int64_t t = 0; t < T; t++) {  // a window never crosses into the other source
        ASSERT_EQ(tok[size_t(r * T + t)] / 100, source) << "step " << step << " row " << r;
        ASSERT_EQ(tgt[size_t(r * T + t)] / 100, source) << "step " << step << " row " << r;
      }
    }
  }
  const double share_b = double(from_b) / double(steps * B);
  EXPECT_NEAR(share_b, 0.3, 0.02);
  EXPECT_NEAR(double(s.stream->mixture().drawn(uint64_t(steps * B), 5)[1]) / double(steps * B), share_b, 1e-12);
}

TEST(MixtureLoader, EachSourceReadsEveryWindowOncePerItsOwnEpoch) {
  const TwoSources s({0.6, 0.4});
  const int64_t T = 10;
  const DataLoader loader(*s.stream, T, 9, 0, 1, DataOrder::kEpoch);
  const uint64_t windows[2] = {(2001 - 1) / 10, (501 - 1) / 10}, base[2] = {0, 2001};
  std::vector<std::map<uint64_t, std::multiset<uint64_t>>> by_epoch(2);
  for (uint64_t g = 0; g < 2000; g++) {  // 800 draws of b: 16 of its epochs
    const data::Mixture::Pick p = s.stream->mixture().pick(g, 9);
    const uint64_t at = loader.window_start(int64_t(g), 1, 0);
    by_epoch[size_t(p.source)][p.index / windows[p.source]].insert((at - base[p.source]) / T);
  }
  for (int k = 0; k < 2; k++)
    for (const auto& [epoch, seen] : by_epoch[size_t(k)]) {
      if (seen.size() < windows[k]) continue;  // the last, partial epoch
      std::multiset<uint64_t> all;
      for (uint64_t w = 0; w < windows[k]; w++) all.insert(w);
      EXPECT_EQ(seen, all) << "source " << k << " epoch " << epoch;
    }
  EXPECT_GE(by_epoch[1].size(), 15u);
}

TEST(MixtureLoader, TheGlobalBatchIsTheSameOnEveryLayoutAndValidationFollowsTheWeights) {
  const TwoSources s({0.25, 0.75});
  const int64_t T = 8, B = 8;
  for (int64_t step : {0, 7, 4000}) testing_support::expect_same_batch_on_dp4_x2(*s.stream, T, 3, step);
  // Validation: 2 batches of 8 rows, a quarter of them (4) from a, as one contiguous block.
  const DataLoader val(*s.stream, T, 3, 0, 1, DataOrder::kEpoch);
  std::vector<int> source;
  for (int64_t i = 0; i < 2; i++) {
    std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
    val.val_batch(i, 2, B, tok.data(), tgt.data());
    for (int64_t r = 0; r < B; r++) source.push_back(tok[size_t(r * T)] / 100);
  }
  EXPECT_EQ(source, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}));
}

Config mixture_run(const std::string& shards, const std::string& ckpt, std::vector<std::string> extra) {
  extra.insert(extra.begin(), "train.val_batches=2");
  return testing_support::shard_run_config(shards, ckpt, extra);
}

TEST(MixtureRun, ResumesOnAnotherLayoutWhereItWouldHaveBeenAndReportsTheShares) {
  TempDir d{"loom-mixrun"};
  testing_support::prepare_fortune_shards("byte", d / "people", 40000);
  testing_support::prepare_fortune_shards("byte", d / "computers", 40000, "computers");
  const std::string mix = "0.7:" + (d / "people") + ",0.3:" + (d / "computers");
  const auto runs = testing_support::expect_resumes_where_it_would_have_been(
      mix, d.path.string(), {{"parallel.dp=2"}, {"parallel.pp=2"}}, {"train.val_batches=2"});
  const TrainSummary& whole = runs[0];
  const data::Mixture m({0.7, 0.3});
  const std::vector<uint64_t> n = m.drawn(48, uint64_t(load_config("", {}).train.seed));
  ASSERT_EQ(whole.mix_drawn.size(), 2u);
  EXPECT_DOUBLE_EQ(whole.mix_drawn[0], double(n[0]) / 48);
  EXPECT_DOUBLE_EQ(whole.mix_drawn[0] + whole.mix_drawn[1], 1.0);
  for (size_t k = 1; k < runs.size(); k++)  // validation over the same rows in each layout
    EXPECT_NEAR(runs[k].final_val_loss, whole.final_val_loss, 1e-5 * whole.final_val_loss);
  // Another weighting is another run.
  const auto other = testing_support::train_keeping_params(
      mixture_run("0.2:" + (d / "people") + ",0.8:" + (d / "computers"), d / "c", {}));
  EXPECT_NE(other[0].losses[1], whole.losses[1]);
}

TEST(MixtureRun, RefusesSourcesOfTwoTokenizersAndLengthBuckets) {
  TempDir d{"loom-mixbad"};
  testing_support::prepare_fortune_shards("byte", d / "bytes");
  testing_support::prepare_fortune_shards("fortunes-1k.model", d / "sp");
  const std::string two = "0.5:" + (d / "bytes") + ",0.5:" + (d / "sp");
  EXPECT_NE(error_message([&] { load_train_data(mixture_run(two, d / "a", {"model.vocab=1000"}), 32); })
                .find("a mixture needs one tokenizer"),
            std::string::npos);
  const std::string same = "0.5:" + (d / "bytes") + ",0.5:" + (d / "bytes") + "/";
  EXPECT_NE(error_message([&] { load_train_data(mixture_run(same, d / "a", {"data.bucketing=true"}), 32); })
                .find("length buckets draw documents from one source"),
            std::string::npos);
  EXPECT_NE(error_message([&] {
              load_train_data(mixture_run("0.5:" + (d / "bytes") + ",0.5:" + (d / "none"), d / "a",
                                          {}),
                              32);
            }).find(d / "none"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
