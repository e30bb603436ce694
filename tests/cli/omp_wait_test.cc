// Note [OpenMP wait policy]: when loom re-executes itself, and what the run's header says.
#include "loom/core/omp_wait.h"

#include <gtest/gtest.h>

#include "support/loom_cli.h"

namespace loom {
namespace {

TEST(OmpWait, ReexecutesOnlyWhenTheUserSetNeitherVariable) {
  EXPECT_TRUE(wants_passive_reexec(nullptr, nullptr));
  EXPECT_FALSE(wants_passive_reexec("active", nullptr));
  EXPECT_FALSE(wants_passive_reexec("passive", nullptr));  // (and so no second exec)
  EXPECT_FALSE(wants_passive_reexec(nullptr, "10000"));
  EXPECT_FALSE(wants_passive_reexec("", nullptr));  // set, even if empty: the user's
}

// The loom binary run with neither variable sets passive for itself; a user's setting stays.
TEST(OmpWait, TheLoomBinaryTakesThePassivePolicyUnlessTheUserChoseOne) {
  using testing_support::run_loom;
  const struct {
    std::string env, header;
  } cases[] = {{"-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT", "(OMP_WAIT_POLICY=passive)"},
               {"-u GOMP_SPINCOUNT OMP_WAIT_POLICY=active", "(OMP_WAIT_POLICY=active)"},
               {"-u OMP_WAIT_POLICY GOMP_SPINCOUNT=5000", "(GOMP_SPINCOUNT=5000)"}};
  int i = 0;
  for (const auto& c : cases) {
    const std::string dir = testing_support::fresh_dir("omp_wait_" + std::to_string(i++));
    const testing_support::CliResult r = run_loom(testing_support::tiny_train(dir, 1), "", c.env);
    EXPECT_EQ(r.code, 0) << c.env << "\n" << r.output;
    EXPECT_NE(r.output.find("threads per rank " + c.header), std::string::npos) << c.env << "\n" << r.output;
  }
}

}  // namespace
}  // namespace loom
