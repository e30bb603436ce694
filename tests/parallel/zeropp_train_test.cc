// ZeRO++ in training (threads backend): hpZ against ZeRO-3 (Note [hpZ]).
#include <gtest/gtest.h>

#include <sstream>

#include "loom/comm/world.h"
#include "loom/train/verify.h"
#include "support/train_threads.h"

namespace loom {
namespace {

Config zero3(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=64", "model.heads=4", "model.ffn=256",
                                   "model.ctx=32", "train.batch=8", "train.steps=3", "train.val_batches=1",
                                   "train.val_every=0", "train.threads=1", "checkpoint.dir=", "comm.timeout_s=60",
                                   "parallel.dp=4", "parallel.zero=3", "train.grad_accum=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return load_config("", sets);
}

// hpZ gathers the values the step's first gather delivered, so it computes exactly what
// ZeRO-3 computes: on one host (the host's ranks are the dp group) and on two (ranks 0, 1 on
// a, 2, 3 on b), with fp32 and with qwZ's int8 gathers, with and without recompute. Every
// gather after a unit's first in a step comes from the host.
TEST(ZeroPP, HpzComputesExactlyWhatZero3Computes) {
  using testing_support::train_as_threads;
  TrainOptions keep;
  keep.keep_params = true;
  for (const std::vector<std::string>& mode :
       std::vector<std::vector<std::string>>{{}, {"parallel.zeropp_qwz=true"}, {"parallel.recompute=full"}}) {
    const std::vector<TrainSummary> ref = train_as_threads(zero3(mode), keep);
    EXPECT_EQ(ref[0].param_gathers_on_host, 0);
    for (const std::vector<std::string>& hosts : {std::vector<std::string>{}, {"a", "a", "b", "b"}}) {
      std::vector<std::string> sets = mode;
      sets.push_back("parallel.zeropp_hpz=true");
      const std::vector<TrainSummary> got = train_as_threads(zero3(sets), keep, hosts);
      const std::string what = (mode.empty() ? "fp32" : mode[0]) + (hosts.empty() ? ", one host" : ", two hosts");
      EXPECT_EQ(got[0].losses, ref[0].losses) << what;
      EXPECT_EQ(got[0].final_params, ref[0].final_params) << what;
      EXPECT_GT(got[0].param_gathers_on_host, 0) << what;
      EXPECT_EQ(got[0].param_gathers + got[0].param_gathers_on_host, ref[0].param_gathers) << what;
    }
  }
}

// loom verify holds qwZ / qgZ to their loss bound (Note [Verify tolerances]) and hpZ alone
// to the exact one.
TEST(ZeroPP, VerifyHoldsInt8ModesToTheirBoundAndHpzToExact) {
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.dp=2", "parallel.zero=3", "parallel.zeropp_qwz=true"},
      {"parallel.dp=2", "parallel.zero=2", "parallel.zeropp_qgz=true"},
      {"parallel.dp=2", "parallel.zero=3", "parallel.zeropp_hpz=true"}};
  Config base = zero3({});
  base.parallel = ParallelConfig{};
  base.train.grad_accum = 1;
  const std::vector<VerifyRow> rows = verify_layouts(base, layouts);
  ASSERT_EQ(rows.size(), 3u);
  for (const VerifyRow& r : rows) EXPECT_TRUE(r.ok) << r.layout << ": " << r.error << " loss rel " << r.max_loss_rel;
  EXPECT_EQ(rows[0].tolerance.loss_rel, kZeroPlusPlusLossRel);
  EXPECT_GT(rows[0].max_loss_rel, 0.0);
  EXPECT_EQ(rows[2].tolerance.loss_rel, VerifyTolerance{}.loss_rel);
}

TEST(ZeroPP, HpzRefusesUnevenHosts) {
  std::vector<std::string> errors = comm::run_threads(
      4, {},
      [](comm::World& w) {
        std::ostringstream sink;
        TrainOptions o;
        o.out = o.err = &sink;
        train(zero3({"parallel.zeropp_hpz=true"}), o, w);
      },
      {"a", "a", "a", "b"});
  for (const std::string& e : errors)
    EXPECT_NE(e.find("needs the same number of a dp group's ranks on every host; host b has 1 and host a has 3"),
              std::string::npos)
        << e;
}

}  // namespace
}  // namespace loom
