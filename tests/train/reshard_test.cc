// Resharding (Note [Sharded checkpoints]): a checkpoint written by one layout loads into
// another with every parameter and moment exactly as written, online (--resume) and
// offline (loom ckpt convert), and training continues to match the single-process run.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "loom/core/error.h"
#include "loom/model/layout.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/shard_ckpt.h"
#include "loom/train/trainer.h"
#include "support/train_threads.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

using Sets = std::vector<std::string>;

Config small(const std::string& dir, const Sets& model, const Sets& layout, int64_t steps) {
  Sets sets = {"model.layers=4", "model.d_model=64", "model.heads=4", "model.ffn=128", "model.ctx=32",
               "train.batch=8", "train.grad_accum=2", "train.val_batches=1", "train.val_every=0",
               "train.threads=1", "checkpoint.save_every=3", "checkpoint.dir=" + dir, "optim.warmup_steps=2",
               "train.steps=" + std::to_string(steps)};
  sets.insert(sets.end(), model.begin(), model.end());
  sets.insert(sets.end(), layout.begin(), layout.end());
  return load_config("", sets);
}

std::vector<TrainSummary> run(const Config& c, const std::string& resume = "") {
  return testing_support::train_keeping_params(c, resume);
}

// The real parameters of a whole-layout flat buffer, tensor after tensor (as final_params).
std::vector<float> unpadded(const ModelConfig& m, const std::vector<float>& flat) {
  std::vector<float> out;
  const ParamLayout layout(m);
  for (const ParamSpec& s : layout.specs())
    out.insert(out.end(), flat.begin() + s.offset, flat.begin() + s.offset + s.numel);
  return out;
}

struct Pair {
  const char* name;
  Sets model, from, to;
};

const std::vector<Pair>& pairs() {
  static const std::vector<Pair> p = {
      {"tp2 x pp2 -> dp4", {}, {"parallel.tp=2", "parallel.pp=2"}, {"parallel.dp=4"}},
      {"zero3 dp4 -> tp2 x dp2", {}, {"parallel.dp=4", "parallel.zero=3"}, {"parallel.tp=2", "parallel.dp=2"}},
      {"pp4 -> pp2", {}, {"parallel.pp=4"}, {"parallel.pp=2"}},
      // Note [Stage split]: stages that only embed / only run the head, into the accounted split.
      {"pp3 split 0,4,0 -> pp2 accounted", {}, {"parallel.pp=3", "parallel.pp_layers=0,4,0"},
       {"parallel.pp=2", "parallel.pp_layers=", "parallel.pp_account_loss=true"}},
      {"zero1 dp2 -> single", {}, {"parallel.dp=2", "parallel.zero=1"}, {}},
      {"single -> tp2 + sp", {}, {}, {"parallel.tp=2", "parallel.sp=true"}},
      {"tp2 replicated vocab -> tp4", {}, {"parallel.tp=2", "parallel.vocab_parallel=false"}, {"parallel.tp=4"}},
      {"interleaved pp2 x vpp2 -> zero2 dp2", {},
       {"parallel.pp=2", "parallel.vpp=2", "parallel.schedule=interleaved"}, {"parallel.dp=2", "parallel.zero=2"}},
      {"llama GQA tp2 x pp2 -> zero3 dp2 x tp2", {"model.arch=llama", "model.kv_heads=2"},
       {"parallel.tp=2", "parallel.pp=2"}, {"parallel.dp=2", "parallel.zero=3", "parallel.tp=2"}},
      // Note [PS checkpoints]: a parameter-server job's servers' shards into collective dp and back.
      // (ckpt convert applies the target's settings over the source's: ps_servers, zero named.)
      {"ps 2 workers + 3 servers -> zero1 dp2", {}, {"parallel.dp=2", "parallel.ps_servers=3"},
       {"parallel.dp=2", "parallel.zero=1", "parallel.ps_servers=0"}},
      {"zero2 dp2 -> ps 2 workers + 1 server", {}, {"parallel.dp=2", "parallel.zero=2"},
       {"parallel.dp=2", "parallel.ps_servers=1", "parallel.zero=0"}},
      // Note [Context-parallel chunks]: cp shards nothing; ZeRO shards over dp x cp.
      {"cp2 x dp2 zero1 -> tp2", {}, {"parallel.cp=2", "parallel.dp=2", "parallel.zero=1"},
       {"parallel.cp=1", "parallel.dp=1", "parallel.zero=0", "parallel.tp=2"}},
      {"zero3 dp2 -> cp4", {}, {"parallel.dp=2", "parallel.zero=3"}, {"parallel.dp=1", "parallel.zero=0", "parallel.cp=4"}},
      // Note [Parameter server with model parallelism]: shards of a tp x pp worker layout.
      {"ps dp2 x pp2 + 1 server per shard -> tp2", {}, {"parallel.dp=2", "parallel.pp=2", "parallel.ps_servers=1"},
       {"parallel.dp=1", "parallel.pp=1", "parallel.tp=2", "parallel.ps_servers=0"}},
      {"zero1 dp2 x pp2 -> ps tp2 + 2 servers per shard", {}, {"parallel.dp=2", "parallel.pp=2", "parallel.zero=1"},
       {"parallel.dp=1", "parallel.pp=1", "parallel.tp=2", "parallel.zero=0", "parallel.ps_servers=2"}},
      // Note [Vocabulary passes]: the vocabulary rows split over pp (x tp), in and out.
      {"pp2 vocab split -> single", {}, {"parallel.pp=2", "parallel.pp_vocab=true"},
       {"parallel.pp=1", "parallel.pp_vocab=false"}},
      {"llama tp2 x pp2 vocab split -> pp3 vocab split", {"model.arch=llama", "model.kv_heads=2"},
       {"parallel.tp=2", "parallel.pp=2", "parallel.pp_vocab=true"}, {"parallel.tp=1", "parallel.pp=3"}},
      {"zero1 dp2 -> tp2 replicated vocab x pp2 vocab split", {}, {"parallel.dp=2", "parallel.zero=1"},
       {"parallel.dp=1", "parallel.zero=0", "parallel.tp=2", "parallel.pp=2", "parallel.pp_vocab=true",
        "parallel.vocab_parallel=false"}},
  };
  return p;
}

TEST(Reshard, EveryTensorAndMomentArrivesExactlyInTheOtherLayout) {
  for (const Pair& p : pairs()) {
    const std::string a = testing::TempDir() + "/reshard_a", b = testing::TempDir() + "/reshard_b",
                      c = testing::TempDir() + "/reshard_c";
    fs::remove_all(a), fs::remove_all(b), fs::remove_all(c);
    const Config from = small(a, p.model, p.from, 6);
    run(from);
    const std::string step = a + "/step-00000003";
    const WholeState want = load_whole(step);
    ASSERT_EQ(want.step, 3) << p.name;
    // Online: the other layout resumes at step 3 with train.steps = 3 (nothing to run), so
    // its final weights are the loaded ones, gathered back into the whole model.
    const auto loaded = run(small(b, p.model, p.to, 3), step);
    EXPECT_EQ(loaded[0].final_params, unpadded(from.model, want.params)) << p.name;
    // Offline: converted, then read back whole: parameters and both moments bit for bit.
    Sets to = p.to;
    const std::string out = convert_shards(step, c, to.empty() ? Sets{"parallel.dp=1"} : to);
    const WholeState got = load_whole(out);
    EXPECT_NE(shard_layout(out), shard_layout(step)) << p.name;
    EXPECT_EQ(got.params, want.params) << p.name;
    EXPECT_EQ(got.m, want.m) << p.name;
    EXPECT_EQ(got.v, want.v) << p.name;
    EXPECT_EQ(got.optimizer_steps, want.optimizer_steps) << p.name;
  }
}

TEST(Reshard, TrainingContinuesToMatchTheSingleProcessRun) {
  for (const Pair& p : pairs()) {
    const std::string a = testing::TempDir() + "/cont_a", b = testing::TempDir() + "/cont_b",
                      r = testing::TempDir() + "/cont_ref";
    fs::remove_all(a), fs::remove_all(b), fs::remove_all(r);
    const auto reference = run(small(r, p.model, {}, 6));
    run(small(a, p.model, p.from, 6));
    const auto resumed = run(small(b, p.model, p.to, 6), a + "/step-00000003");
    ASSERT_EQ(resumed[0].losses.size(), 3u) << p.name;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(resumed[0].losses[i], reference[0].losses[3 + i], 5e-5) << p.name << " step " << 4 + i;
    ASSERT_EQ(resumed[0].final_params.size(), reference[0].final_params.size());
    double worst = 0;
    for (size_t i = 0; i < resumed[0].final_params.size(); ++i)
      worst = std::max(worst, double(std::abs(resumed[0].final_params[i] - reference[0].final_params[i])));
    EXPECT_LT(worst, 1e-4) << p.name;
  }
}

TEST(Reshard, ConvertRefusesModelChangesAndExportReadsShards) {
  const std::string a = testing::TempDir() + "/conv_a", c = testing::TempDir() + "/conv_c";
  fs::remove_all(a), fs::remove_all(c);
  run(small(a, {}, {"parallel.dp=2", "parallel.zero=3"}, 3));
  try {
    convert_shards(a, c, {"model.d_model=32"});
    FAIL() << "convert changed the model";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.d_model=32' is not a layout setting"), std::string::npos) << e.what();
  }
  try {
    convert_shards(a, c, {"parallel.tp=3"});
    FAIL() << "convert accepted tp = 3 with 4 heads";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp"), std::string::npos) << e.what();
  }
  // The whole-model checkpoint reader (export, sample) takes the sharded directory itself.
  const CheckpointData ck = load_checkpoint(a);
  const WholeState w = load_whole(a);
  EXPECT_EQ(ck.params, w.params);
  EXPECT_EQ(ck.state.step, 3);
  ASSERT_TRUE(ck.m.has_value());
  EXPECT_EQ(*ck.m, w.m);
  const std::string st = testing::TempDir() + "/conv.safetensors";
  export_safetensors(a, st);
  EXPECT_GT(fs::file_size(st), size_t(4 * w.params.size() / 2));
}

}  // namespace
}  // namespace loom
