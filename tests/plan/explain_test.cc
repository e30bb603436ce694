// Note [Error bands] and Note [Plan explanation]: the validation a plan line carries and the
// term-by-term comparison of the first two candidates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/plan/explain.h"
#include "loom/sim/validation.h"
#include "support/error_message.h"

namespace loom {
namespace {

using sim::LayoutKind;

sim::SimPlan plan_of(const std::vector<std::string>& sets, int64_t cp = 1) {
  sim::SimPlan p;
  p.cfg = load_config("", sets);
  p.cp = cp;
  return p;
}

TEST(ErrorBands, LayoutKindsFollowThePublishedCategories) {
  EXPECT_EQ(sim::layout_kind(plan_of({"parallel.dp=8"})), LayoutKind::kDataParallel);
  EXPECT_EQ(sim::layout_kind(plan_of({"parallel.dp=8", "parallel.zero=1"})), LayoutKind::kDataParallel);
  EXPECT_EQ(sim::layout_kind(plan_of({"parallel.dp=8", "parallel.zero=3"})), LayoutKind::kSharded);
  EXPECT_EQ(sim::layout_kind(plan_of({"parallel.dp=4", "parallel.tp=2", "parallel.zero=2"})), LayoutKind::kModelParallel);
  EXPECT_EQ(sim::layout_kind(plan_of({"parallel.dp=4"}, 2)), LayoutKind::kModelParallel);
  EXPECT_EQ(sim::layout_kind(plan_of({"parallel.dp=4", "parallel.ps_servers=2"})), LayoutKind::kParameterServer);
}

// Points of kind K on device D: median of the signed errors, median and max of |error|; the
// other device's points count only when D has none, and the basis says so.
TEST(ErrorBands, BandIsTheKindsErrorsOnTheDeviceElseOnAnyDevice) {
  const std::vector<sim::ValidationPoint> pts = {{LayoutKind::kSharded, "H100", -0.30}, {LayoutKind::kSharded, "H100", -0.10},
                                                 {LayoutKind::kSharded, "H100", 0.05}, {LayoutKind::kSharded, "A100", 0.50},
                                                 {LayoutKind::kModelParallel, "A100", 0.02}};
  sim::ErrorBand b = sim::error_band(pts, LayoutKind::kSharded, "H100", "published");
  EXPECT_EQ(b.rows, 3);
  EXPECT_DOUBLE_EQ(b.median, -0.10);
  EXPECT_DOUBLE_EQ(b.median_abs, 0.10);
  EXPECT_DOUBLE_EQ(b.max_abs, 0.30);
  EXPECT_EQ(b.basis, "3 published sharded data-parallel runs on H100");
  b = sim::error_band(pts, LayoutKind::kModelParallel, "H100", "published");
  EXPECT_EQ(b.rows, 1);
  EXPECT_DOUBLE_EQ(b.median, 0.02);
  EXPECT_EQ(b.basis, "1 published model-parallel runs on other devices (none on H100)");
  b = sim::error_band(pts, LayoutKind::kParameterServer, "H100", "published");
  EXPECT_EQ(b.rows, 0);
  EXPECT_NE(b.basis.find("not validated"), std::string::npos);
}

// The compiled-in published rows: every row the reader can express, each kind represented.
TEST(ErrorBands, PublishedPointsCoverTheKinds) {
  const auto& pts = sim::published_points();
  EXPECT_GE(pts.size(), 80u);
  int n[4] = {0, 0, 0, 0};
  for (const auto& p : pts) {
    ++n[int(p.kind)];
    EXPECT_TRUE(std::isfinite(p.error) && p.error > -1) << p.device;
    EXPECT_TRUE(p.device == "A100" || p.device == "H100") << p.device;
  }
  EXPECT_GT(n[int(LayoutKind::kDataParallel)], 0);
  EXPECT_GT(n[int(LayoutKind::kSharded)], 10);
  EXPECT_GT(n[int(LayoutKind::kModelParallel)], 10);
  EXPECT_EQ(n[int(LayoutKind::kParameterServer)], 0);
}

// bench/sim_vs_engine writes the engine's errors beside the cluster file; the planner reads
// them back, and refuses a damaged file naming the line.
TEST(ErrorBands, EnginePointsRoundTripBesideTheClusterFile) {
  const std::string cluster = ::testing::TempDir() + "/cluster-test.toml";
  const std::string path = sim::validation_path_for(cluster);
  EXPECT_EQ(path, ::testing::TempDir() + "/cluster-test.validation.csv");
  std::remove(path.c_str());
  EXPECT_TRUE(plan::validation_points(sim::Framework::kLoom, cluster).empty());
  EXPECT_TRUE(plan::validation_points(sim::Framework::kLoom, "").empty());  // a preset: nothing measured
  const std::vector<sim::ValidationPoint> pts = {{LayoutKind::kSharded, "local", -0.25},
                                                 {LayoutKind::kDataParallel, "local", 0.125}};
  sim::write_engine_points(path, pts, "0123abcd");
  std::string stamp;
  EXPECT_EQ(sim::engine_points(path, &stamp).size(), 2u);
  EXPECT_EQ(stamp, "0123abcd");
  const auto back = plan::validation_points(sim::Framework::kLoom, cluster);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].kind, LayoutKind::kSharded);
  EXPECT_EQ(back[1].device, "local");
  EXPECT_DOUBLE_EQ(back[1].error, 0.125);
  std::ofstream(path) << "# calibration 1\nkind,device,error\nsharded data-parallel,local,oops\n";
  const std::string msg = testing_support::error_message([&] { sim::engine_points(path); });
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sim_vs_engine"), std::string::npos) << msg;
  std::remove(path.c_str());
}

// Note [Stale error bands]: the errors are the calibration's they were scored against; a
// recalibrated cluster file (another text), or a file from before the stamp, makes them stale.
TEST(ErrorBands, BandsScoredAgainstAnotherCalibrationAreStale) {
  const std::string cluster = ::testing::TempDir() + "/cluster-stale.toml";
  const std::string path = sim::validation_path_for(cluster);
  std::remove(path.c_str());
  std::ofstream(cluster) << "name = 'local'\n# calibration one\n";
  EXPECT_FALSE(sim::engine_points_stale(cluster));  // nothing measured: nothing stale
  const std::string one = sim::calibration_stamp(cluster);
  EXPECT_FALSE(one.empty());
  sim::write_engine_points(path, {{LayoutKind::kDataParallel, "local", 0.1}}, one);
  EXPECT_FALSE(sim::engine_points_stale(cluster));
  std::ofstream(cluster) << "name = 'local'\n# calibration two\n";
  EXPECT_NE(sim::calibration_stamp(cluster), one);
  EXPECT_TRUE(sim::engine_points_stale(cluster));
  std::ofstream(path) << "kind,device,error\ndata-parallel,local,0.1\n";  // before stamps
  EXPECT_EQ(plan::validation_points(sim::Framework::kLoom, cluster).size(), 1u);
  EXPECT_TRUE(sim::engine_points_stale(cluster));
  std::remove(path.c_str());
  std::remove(cluster.c_str());
  EXPECT_EQ(sim::calibration_stamp(cluster), "");
}

plan::PlanCandidate candidate(double compute, double bubble, double step) {
  plan::PlanCandidate c;
  c.plan = plan_of({"parallel.dp=8"});
  c.result.breakdown.compute = compute, c.result.breakdown.pp_idle = bubble;
  c.result.step_time_s = step;
  return c;
}

// Terms both candidates leave at zero are dropped; the rest are ordered by |#1 - #2|.
TEST(PlanExplanation, TermsAreOrderedByTheirDifference) {
  const auto d = plan::term_deltas(candidate(10, 1, 11).result, candidate(9.5, 3, 12.5).result);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].name, "pipeline idle (bubble)");
  EXPECT_DOUBLE_EQ(d[0].delta(), -2);
  EXPECT_EQ(d[1].name, "compute");
  EXPECT_DOUBLE_EQ(d[1].delta(), 0.5);
}

// A 12% gap is outside a 5% band and the order holds; a 2% gap is inside it.
TEST(PlanExplanation, SaysWhenTheGapIsInsideTheSimulatorsError) {
  sim::ErrorBand band;
  band.rows = 10, band.median_abs = 0.05, band.basis = "10 published data-parallel runs on A100";
  std::string text = plan::explain_choice(candidate(10, 1, 11), candidate(9.5, 3, 12.5), band, band);
  EXPECT_NE(text.find("its step is 1.5000 s shorter (12.0%)"), std::string::npos) << text;
  EXPECT_NE(text.find("the order should hold"), std::string::npos) << text;
  text = plan::explain_choice(candidate(10, 1, 11), candidate(10, 1.2, 11.2), band, band);
  EXPECT_NE(text.find("not reliable"), std::string::npos) << text;
  sim::ErrorBand none;
  none.basis = "no measured parameter-server runs: this kind is not validated";
  text = plan::explain_choice(candidate(10, 1, 11), candidate(9.5, 3, 12.5), band, none);
  EXPECT_NE(text.find("is unknown"), std::string::npos) << text;
}

}  // namespace
}  // namespace loom
