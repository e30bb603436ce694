// Note [Elastic growth]: a stop the supervisor asks for ends every rank after the same save.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <sstream>

#include "loom/ckpt/run_dir.h"
#include "loom/comm/world.h"
#include "loom/core/config.h"
#include "loom/train/trainer.h"

namespace loom {
namespace {

TEST(ElasticStop, AStopSeenByOneRankStopsEveryRankAfterTheSameSave) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/elastic_stop";
  fs::remove_all(dir);
  const Config c = load_config("", {"parallel.dp=2", "train.steps=12", "checkpoint.save_every=3",
                                    "checkpoint.dir=" + dir, "model.layers=1", "train.threads=1", "train.val_every=0",
                                    "train.val_batches=1", "train.batch=4", "train.seq=32"});
  std::ostringstream sink;
  std::vector<int64_t> stopped(2, -1);
  std::vector<size_t> steps(2, 0);
  std::atomic<int> asked{0};
  const auto errors = comm::run_threads(2, {}, [&](comm::World& w) {
    TrainOptions o;
    o.out = o.err = &sink;
    const int r = w.global_rank();
    o.stop_requested = [r, &asked] { return r == 1 && ++asked >= 2; };  // rank 1 sees it at the second save
    const TrainSummary s = train(c, o, w);
    stopped[size_t(r)] = s.stopped_at, steps[size_t(r)] = s.losses.size();
  });
  EXPECT_EQ(errors, std::vector<std::string>(2));
  EXPECT_EQ(stopped, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(steps, (std::vector<size_t>{6, 6}));
  EXPECT_EQ(survey_dir(dir).steps, (std::vector<int64_t>{3, 6}));
  // Never asked: the run goes to its end.
  fs::remove_all(dir);
  const auto plain = comm::run_threads(2, {}, [&](comm::World& w) {
    TrainOptions o;
    o.out = o.err = &sink;
    o.stop_requested = [] { return false; };
    EXPECT_EQ(train(c, o, w).stopped_at, 0);
  });
  EXPECT_EQ(plain, std::vector<std::string>(2));
  EXPECT_EQ(survey_dir(dir).steps.back(), 12);
}

}  // namespace
}  // namespace loom
