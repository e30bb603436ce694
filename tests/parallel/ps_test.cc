// Parameter-server data parallelism (Note [Parameter server] in parallel/ps.h): the key
// partition, synchronous training against the single-process run with pushes arriving in
// shuffled order, and refusals.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.h"
#include "loom/parallel/ps.h"
#include "loom/train/verify.h"
#include "support/error_message.h"
#include "support/train_threads.h"

namespace loom {
namespace {

// Every float on exactly one server, in key order; the servers' key counts differ by at most
// one (bytes balanced within one key); fewer keys than servers is refused.
TEST(ParameterServer, PartitionPutsEveryKeyOnOneServerBalancedWithinOneKey) {
  for (int64_t floats : {1, 1000, 1024, 1025, 4096 * 7 + 13, 1 << 20})
    for (int servers = 1; servers <= 5; ++servers) {
      const int64_t keys = (floats + 1023) / 1024;
      if (keys < servers) {
        EXPECT_THROW(parallel::ps_partition(floats, servers), Error) << floats << " floats, " << servers;
        continue;
      }
      const std::vector<FlatRange> r = parallel::ps_partition(floats, servers);
      ASSERT_EQ(r.size(), size_t(servers));
      int64_t at = 0, most = 0, least = INT64_MAX;
      for (const FlatRange& x : r) {
        EXPECT_EQ(x.offset, at);
        EXPECT_EQ(x.offset % 1024, 0);
        at += x.count;
        const int64_t k = (x.count + 1023) / 1024;
        most = std::max(most, k), least = std::min(least, k);
      }
      EXPECT_EQ(at, floats);
      EXPECT_LE(most - least, 1) << floats << " floats, " << servers << " servers";
    }
}

Config base(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.ffn=128",
                                   "model.ctx=32", "train.steps=8", "train.batch=12", "train.val_batches=1",
                                   "train.val_every=4", "train.threads=1", "checkpoint.dir=", "comm.timeout_s=60",
                                   "optim.warmup_steps=2", "optim.grad_clip=0.3"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

// Sync PS (BSP) is the single-process run with the same global batch, within loom verify's
// data-parallel tolerances: 2 workers and 2 servers, 3 workers and 1 server (clipping active),
// with every push delayed by a random few milliseconds so they arrive in shuffled order.
TEST(ParameterServer, SyncEqualsTheSingleProcessRunWithShuffledArrivals) {
  const TrainSummary ref = testing_support::train_keeping_params(base({}))[0];
  for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
           {"parallel.dp=2", "parallel.ps_servers=2", "train.grad_accum=2"},
           {"parallel.dp=3", "parallel.ps_servers=1"}}) {
    const Config c = base(layout);
    TrainOptions o;
    o.keep_params = true;
    o.before_ps_push = [](int64_t step) {
      thread_local std::mt19937 rng(std::hash<std::thread::id>{}(std::this_thread::get_id()) + uint64_t(step));
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 6));
    };
    const std::vector<TrainSummary> got = testing_support::train_as_threads(c, o);
    for (int w = 0; w < int(c.parallel.dp); ++w) {
      const VerifyRow row = compare_runs(layout[0], ref, got[size_t(w)], tolerance_for(c));
      EXPECT_TRUE(row.ok) << layout[0] << " " << layout[1] << " worker " << w << ": " << row.error << " loss rel "
                          << row.max_loss_rel << ", weight " << row.max_weight_abs;
      EXPECT_EQ(got[size_t(w)].final_params, got[0].final_params);
    }
    for (size_t s = size_t(c.parallel.dp); s < got.size(); ++s) EXPECT_TRUE(got[s].losses.empty());
  }
}

TEST(ParameterServer, RefusesWhatItDoesNotRunYet) {
  auto error = [](std::vector<std::string> sets) {
    return testing_support::error_message([&] { base(sets); });
  };
  EXPECT_NE(error({"parallel.ps_servers=1", "parallel.tp=2"}).find("data parallel only so far"), std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=1", "ps.mode=async"}).find("only sync"), std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=1", "checkpoint.save_every=2"}).find("set checkpoint.save_every = 0"),
            std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=1", "parallel.dp=2", "parallel.zero=1"}).find("set zero = 0"), std::string::npos);
}

}  // namespace
}  // namespace loom
