// Parameter-server data parallelism (Note [Parameter server], Note [Asynchronous parameter
// server] in modes/ps/ps.h): the key partition, synchronous training against the
// single-process run with pushes arriving in shuffled order, async / ssp against sync and
// their staleness records, and refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/ckpt/shard_ckpt.h"
#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/modes/ps/ps.h"
#include "loom/train/verify.h"
#include "support/error_message.h"
#include "support/ps_applied.h"
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

// The push / pull / wait API: push returns the worker's clock as its timestamp, pull the same,
// and wait(ts) brings the server's answer to that push (which the server gives only after
// taking it: a pull sees its own push). Two servers, each doubling the slice it got and
// echoing the clock as the version; the answers land straight in `params`.
TEST(ParameterServer, PullSeesThisWorkersOwnPush) {
  const std::vector<FlatRange> ranges = parallel::ps_partition(3000, 2);
  const Config one_worker = load_config("", {"parallel.dp=1", "parallel.ps_servers=2"});
  const auto errors = comm::run_threads(3, {}, [&](comm::World& world) {
    std::vector<std::unique_ptr<comm::Group>> links = parallel::ps_groups(world, one_worker).links;
    if (world.global_rank() == 0) {
      parallel::PsWorker worker(*links[0], ranges);
      std::vector<float> grads(3000), params(3000, 0.0f);
      for (int64_t clock = 0; clock < 3; ++clock) {
        for (size_t i = 0; i < grads.size(); ++i) grads[i] = float(i) + float(clock);
        const int64_t ts = worker.push(grads.data(), clock, 1.0);
        EXPECT_EQ(ts, clock);
        EXPECT_EQ(worker.pull(params.data()), ts);
        const parallel::PsReply r = worker.wait(ts);
        for (size_t i = 0; i < params.size(); ++i) ASSERT_EQ(params[i], 2 * grads[i]) << "clock " << clock;
        EXPECT_EQ(r.stop, clock == 2);
      }
      return;
    }
    const FlatRange own = ranges[size_t(world.global_rank() - 1)];
    comm::Group& link = *links[0];
    std::vector<float> slice(size_t(own.count));
    for (int64_t clock = 0; clock < 3; ++clock) {
      float head[parallel::PsPush::kTrailer];
      link.recv(std::span<float>(head, parallel::PsPush::kTrailer), 0, parallel::ps_tag(clock));
      EXPECT_EQ(head[parallel::PsPush::kClock], float(clock));
      link.recv(std::span<float>(slice), 0, parallel::ps_tag(clock));
      for (float& x : slice) x *= 2;
      const float tail[parallel::PsAnswer::kTrailer] = {1.0f, float(clock + 1), clock == 2 ? 1.0f : 0.0f, 0.5f};
      link.send(std::span<const float>(slice), 0, parallel::ps_tag(clock));
      link.send(std::span<const float>(tail, parallel::PsAnswer::kTrailer), 0, parallel::ps_tag(clock));
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(3));
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
    const std::vector<TrainSummary> got = testing_support::train_as_threads(c, testing_support::shuffled_arrivals());
    for (int w = 0; w < int(c.parallel.dp); ++w) {
      const VerifyRow row = compare_runs(layout[0], ref, got[size_t(w)], tolerance_for(c));
      EXPECT_TRUE(row.ok) << layout[0] << " " << layout[1] << " worker " << w << ": " << row.error << " loss rel "
                          << row.max_loss_rel << ", weight " << row.max_weight_abs;
      EXPECT_EQ(got[size_t(w)].final_params, got[0].final_params);
    }
    for (size_t s = size_t(c.parallel.dp); s < got.size(); ++s) EXPECT_TRUE(got[s].losses.empty());
  }
}

// Note [SGD with momentum] on the servers: sync PS with optim.name = sgd is the single-process
// SGD run within loom verify's tolerances (the servers keep the momentum; clipping on).
TEST(ParameterServer, SyncServersRunSgdAsTheSingleProcessDoes) {
  const std::vector<std::string> sgd = {"optim.name=sgd", "optim.momentum=0.9", "optim.lr=0.05"};
  const TrainSummary ref = testing_support::train_keeping_params(base(sgd))[0];
  std::vector<std::string> sets = sgd;
  sets.insert(sets.end(), {"parallel.dp=2", "parallel.ps_servers=2"});
  const Config c = base(sets);
  const TrainSummary got = testing_support::train_keeping_params(c)[0];
  const VerifyRow row = compare_runs("ps sgd", ref, got, tolerance_for(c));
  EXPECT_TRUE(row.ok) << row.error << " loss rel " << row.max_loss_rel << ", weight " << row.max_weight_abs;
  EXPECT_LT(got.losses.back(), got.losses.front());
}

// With one worker there is nothing to be stale against: async and ssp (bound 0) apply the
// same gradients in the same order at the same learning rates as sync, so the runs agree bit
// for bit (no clipping: sync clips by the servers' norm sum, async by the worker's own).
TEST(ParameterServer, AsyncWithOneWorkerIsSyncBitForBit) {
  TrainOptions o;
  o.keep_params = true;
  const std::vector<std::string> one = {"parallel.dp=1", "parallel.ps_servers=2", "optim.grad_clip=0"};
  const TrainSummary sync = testing_support::train_as_threads(base(one), o)[0];
  for (const char* mode : {"ps.mode=async", "ps.mode=ssp"}) {
    std::vector<std::string> sets = one;
    sets.insert(sets.end(), {mode, "ps.staleness=0"});
    const TrainSummary got = testing_support::train_as_threads(base(sets), o)[0];
    EXPECT_EQ(got.losses, sync.losses) << mode;
    EXPECT_EQ(got.final_params, sync.final_params) << mode;
    EXPECT_EQ(got.ps_pushes, 8) << mode;
    EXPECT_EQ(got.ps_max_staleness, 0) << mode;
  }
}

using testing_support::Applied;

// Runs a free-running layout of W workers (worker W - 1 slowed by `slow`) and checks what
// holds whatever the timing: every server applied the same pushes (each worker's clocks 0, 1,
// ... in order), exactly W x steps of them (Note [Exact push count]); a worker made at most
// one push more than were applied of its own (the one refused once the budget was in).
void expect_consistent_pushes(Applied& a, const std::vector<TrainSummary>& got, int W, int S, int64_t steps) {
  const std::vector<int64_t> next = a.expect_same_pushes(W, S, steps);
  for (int w = 0; w < W; ++w) {
    EXPECT_GE(got[size_t(w)].ps_worker_pushes, next[size_t(w)]) << "worker " << w;
    EXPECT_LE(got[size_t(w)].ps_worker_pushes, next[size_t(w)] + 1) << "worker " << w;
  }
  for (const TrainSummary& g : got) EXPECT_EQ(g.ps_pushes, int64_t(a.by_server[0].size()));
}

// SSP's bound holds with a worker running 3x slower: every applied gradient was computed
// from weights at most tau = 1 rounds behind its own clock, and so no worker got more than
// tau + 1 pushes ahead of another.
TEST(ParameterServer, SspBoundsStalenessWithASlowWorker) {
  Applied a;
  const Config c = base({"parallel.dp=3", "parallel.ps_servers=2", "ps.mode=ssp", "ps.staleness=1",
                         "ps.slow_worker=2", "ps.slow_factor=3"});
  const std::vector<TrainSummary> got = testing_support::train_as_threads(c, a.options());
  expect_consistent_pushes(a, got, 3, 2, 8);
  EXPECT_LE(a.most_stale, 1);
  for (const TrainSummary& g : got) EXPECT_LE(g.ps_max_staleness, 1);
  int64_t most = 0, least = INT64_MAX;
  for (int w = 0; w < 3; ++w) most = std::max(most, got[size_t(w)].ps_worker_pushes),
                              least = std::min(least, got[size_t(w)].ps_worker_pushes);
  EXPECT_LE(most - least, 2);
}

// Async lets a fast worker run ahead (a 4x slower peer leaves it stale gradients on the
// server, and it pushes more than its share), and still trains: the loss falls.
TEST(ParameterServer, AsyncRunsAheadOfASlowWorkerAndTrains) {
  Applied a;
  // (memory.limit_gib: the per-step budget check must not make the workers meet each step.)
  const Config c = base({"parallel.dp=2", "parallel.ps_servers=1", "ps.mode=async", "ps.slow_worker=1",
                         "ps.slow_factor=4", "train.steps=12", "memory.limit_gib=64"});
  const std::vector<TrainSummary> got = testing_support::train_as_threads(c, a.options());
  expect_consistent_pushes(a, got, 2, 1, 12);
  EXPECT_GT(a.most_stale, 0);
  EXPECT_GT(got[0].ps_worker_pushes, got[1].ps_worker_pushes);
  ASSERT_FALSE(got[0].losses.empty());
  EXPECT_LT(got[0].losses.back(), got[0].losses.front());
  EXPECT_GT(got[0].final_val_loss, 0);
}

// Note [Exact push count] with three servers: the two that are not the leader park the last
// pushes until the leader's verdict, and all three apply the same W x steps pushes, in async
// and in ssp, with a slow worker and without.
TEST(ParameterServer, EveryServerAppliesExactlyTheBudget) {
  for (const char* mode : {"ps.mode=async", "ps.mode=ssp"})
    for (const char* slow : {"ps.slow_factor=1", "ps.slow_factor=3"}) {
      SCOPED_TRACE(std::string(mode) + " " + slow);
      Applied a;
      const Config c = base({"parallel.dp=3", "parallel.ps_servers=3", mode, "ps.staleness=2", "ps.slow_worker=1",
                             slow, "train.steps=7", "memory.limit_gib=64"});
      const std::vector<TrainSummary> got = testing_support::train_as_threads(c, a.options());
      expect_consistent_pushes(a, got, 3, 3, 7);
    }
}

// Note [PS checkpoints] under ssp: the end is saved as step train.steps; a run resumed from
// it goes on with every clock at that step (staleness still within the bound, counted from
// the resumed weights) and starts from the trained weights.
TEST(ParameterServer, FreeRunningCheckpointResumesWithinTheBound) {
  const std::string a = ::testing::TempDir() + "/ps_free_a", b = ::testing::TempDir() + "/ps_free_b";
  std::filesystem::remove_all(a), std::filesystem::remove_all(b);
  const std::vector<std::string> ssp = {"parallel.dp=2", "parallel.ps_servers=1", "ps.mode=ssp", "ps.staleness=1"};
  std::vector<std::string> first_sets = ssp, next_sets = ssp;
  first_sets.push_back("checkpoint.dir=" + a);
  next_sets.insert(next_sets.end(), {"checkpoint.dir=" + b, "train.steps=12"});
  const TrainSummary first = testing_support::train_as_threads(base(first_sets))[0];
  ASSERT_EQ(resolve_step_dir(a), a + "/step-00000008");
  Applied rec;
  TrainOptions o = rec.options();
  o.resume = a;
  const std::vector<TrainSummary> next = testing_support::train_as_threads(base(next_sets), o);
  EXPECT_LE(rec.most_stale, 1);
  for (const auto& [w, clock] : rec.by_server[0]) EXPECT_GE(clock, 8) << "worker " << w;
  EXPECT_EQ(next[0].ps_pushes, 8);  // 2 workers x steps 8 .. 12
  ASSERT_FALSE(next[0].losses.empty());
  EXPECT_LT(next[0].losses.front(), first.losses.front());
  EXPECT_EQ(resolve_step_dir(b), b + "/step-00000012");
}

TEST(ParameterServer, RefusesWhatItDoesNotRunYet) {
  auto error = [](std::vector<std::string> sets) {
    return testing_support::error_message([&] { base(sets); });
  };
  EXPECT_NE(error({"parallel.ps_servers=1", "ps.mode=hogwild"}).find("expected sync"), std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=1", "ps.staleness=-1"}).find("ps.staleness = -1"), std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=1", "ps.slow_worker=1"}).find("a worker 0 .. 0"), std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=1", "ps.mode=ssp", "checkpoint.save_every=2"})
                .find("set checkpoint.save_every = 0 or ps.mode = sync"),
            std::string::npos);
  EXPECT_NE(error({"parallel.ps_servers=1", "parallel.dp=2", "parallel.zero=1"}).find("set zero = 0"), std::string::npos);
}

}  // namespace
}  // namespace loom
