// Note [Goodput]: Young's and Daly's save intervals and Daly's expected goodput.
#include <gtest/gtest.h>

#include <cmath>

#include "loom/sim/goodput.h"

namespace loom::sim {
namespace {

TEST(Goodput, DalysIntervalMaximisesDalysGoodputAndYoungsIsItsFirstOrder) {
  const double save = 60, restart = 600, mtbf = 100 * 3600.0;
  EXPECT_NEAR(young_interval_s(save, mtbf), std::sqrt(2 * 60 * 360000.0), 1e-9);
  const double daly = daly_interval_s(save, mtbf);
  const double x = save / (2 * mtbf);
  EXPECT_NEAR(daly, std::sqrt(2 * save * mtbf) * (1 + std::sqrt(x) / 3 + x / 9) - save, 1e-9);
  EXPECT_NEAR(daly / young_interval_s(save, mtbf), 1, 0.01);  // save << MTBF: first order suffices
  const double g = expected_goodput(daly, save, restart, mtbf);
  for (double f : {0.5, 0.8, 0.95, 1.05, 1.25, 2.0}) EXPECT_GT(g, expected_goodput(f * daly, save, restart, mtbf)) << f;
  // The wall-time model by hand: tau / (M e^(R/M) (e^((tau + delta)/M) - 1)).
  EXPECT_NEAR(expected_goodput(3600, save, restart, mtbf),
              3600 / (mtbf * std::exp(restart / mtbf) * (std::exp((3600 + save) / mtbf) - 1)), 1e-12);
  EXPECT_DOUBLE_EQ(daly_interval_s(3 * mtbf, mtbf), mtbf);  // a save longer than 2 MTBF: save every MTBF
}

TEST(Goodput, TheReportRoundsDalysIntervalToWholeStepsOfTheLayout) {
  const FailureModel f{20000 * 3600.0, 30, 300};
  const GoodputReport g = goodput_report(f, 8, 3.0);
  EXPECT_EQ(g.nodes, 8);
  EXPECT_DOUBLE_EQ(g.job_mtbf_s, 2500 * 3600.0);
  EXPECT_EQ(g.save_every, std::llround(daly_interval_s(30, g.job_mtbf_s) / 3.0));
  EXPECT_DOUBLE_EQ(g.goodput, expected_goodput(double(g.save_every) * 3.0, 30, 300, g.job_mtbf_s));
  EXPECT_GT(g.goodput, 0.99);
  // More nodes fail more often: a shorter interval and a lower goodput.
  const GoodputReport big = goodput_report(f, 2048, 3.0);
  EXPECT_LT(big.save_every, g.save_every);
  EXPECT_LT(big.goodput, g.goodput);
  EXPECT_NE(goodput_text(g, 8).find("over 8 nodes; save every"), std::string::npos);
}

}  // namespace
}  // namespace loom::sim
